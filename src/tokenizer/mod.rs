//! The Laguna tokenizer: GPT-2 byte-level BPE with the Laguna pre-tokenizer, loaded from
//! GGUF metadata or a HF `tokenizer.json`, producing the same ids as HF `tokenizers`
//! (spec/laguna.md §7.1).
//!
//! ```text
//! encode(bytes):  added tokens matched in the raw text  (added.rs)
//!                 └ text between them: line-break split → Qwen2 regex  (pretokenize.rs)
//!                   └ each piece: bytes → byte-level symbols → BPE merges  (bpe.rs, bytelevel.rs)
//!                 [+ BOS when asked and the tokenizer's template adds it]
//! decode(ids):    concatenated token bytes  (stream.rs: incremental, UTF-8 safe)
//! ```
//!
//! Input is bytes, not `str`: invalid UTF-8 is tokenized through the byte-level alphabet
//! (each maximal invalid subpart is one "other" character for the pre-tokenizer) and
//! decodes back to the same bytes. HF `tokenizers` cannot take such input at all; after
//! `errors='replace'` decoding it would see U+FFFD (bytes EF BF BD) instead.

mod added;
mod bpe;
pub mod bytelevel;
mod error;
mod load;
pub mod pretokenize;
pub mod stream;
mod unicode_tables;

use std::collections::HashMap;

pub use added::AddedToken;
pub use error::TokenizerError;
pub use load::GgufKv;
pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;

use added::{AddedVocab, Segment};
use bpe::{Bpe, MergeMap, Scratch, pair_key};

/// What a token is, with llama.cpp's token-type names (GGUF `tokenizer.ggml.token_type`).
/// From a HF tokenizer.json: added tokens are `Control` when `special`, else
/// `UserDefined`; the rest `Normal`. (The GGUF converter promotes Laguna's non-special
/// `</assistant>` to `Control`, so the two sources differ for that one token.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    /// No token at this id (a hole in the vocabulary or a `[PAD…]` filler).
    Unused,
    Byte,
}

/// Ids of the tokens with a role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End of turn (Laguna: `</assistant>`, id 24); generation stops on it as on EOS.
    pub eot: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
}

/// Options for [`Tokenizer::encode_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add the tokens the tokenizer's template puts around a sequence (Laguna: BOS).
    pub add_special: bool,
    /// Treat the text of special tokens as plain text (HF `split_special_tokens`); for
    /// untrusted text spliced into a prompt. Non-special added tokens are still matched.
    pub split_special: bool,
}

/// A loaded tokenizer. Immutable and `Sync`; encoding keeps its cache per call.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    /// Vocabulary string per id (`None` for holes).
    tokens: Vec<Option<Box<str>>>,
    kinds: Vec<TokenKind>,
    /// The BPE model's own vocabulary (what `ignore_merges` and merges look up).
    model_vocab: HashMap<String, u32>,
    /// Added-token contents → id; looked up before `model_vocab`.
    added_ids: HashMap<String, u32>,
    /// Decoded bytes of every id: `decoded[decoded_at[id]..decoded_at[id + 1]]`.
    decoded: Vec<u8>,
    decoded_at: Vec<u32>,
    bpe: Bpe,
    added: AddedVocab,
    pre: PreTokenizer,
    special: SpecialIds,
    /// Ids put before / after a sequence when `add_special` is set.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
}

/// Everything a loader extracts, before tables are built.
pub(crate) struct Parts {
    pub model_vocab: HashMap<String, u32>,
    /// In rank order.
    pub merges: Vec<(String, String)>,
    pub added: Vec<AddedToken>,
    /// Token kinds by id where the source states them (GGUF); otherwise derived.
    pub kinds: Option<Vec<TokenKind>>,
    pub unk: Option<(u32, bool)>,
    pub ignore_merges: bool,
    pub pre: PreTokenizer,
    pub special: SpecialIds,
    pub prefix: Vec<u32>,
    pub suffix: Vec<u32>,
}

impl Tokenizer {
    pub(crate) fn from_parts(p: Parts) -> Result<Tokenizer, TokenizerError> {
        let n_ids = p
            .model_vocab
            .values()
            .chain(p.added.iter().map(|t| &t.id))
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);

        let mut tokens: Vec<Option<Box<str>>> = vec![None; n_ids];
        for (s, &id) in &p.model_vocab {
            tokens[id as usize] = Some(s.as_str().into());
        }
        // HF `simple_id_to_token`: an added token's content wins over the model's string.
        for t in &p.added {
            tokens[t.id as usize] = Some(t.content.as_str().into());
        }

        let kinds = match p.kinds {
            Some(k) => {
                let mut k = k;
                k.resize(n_ids, TokenKind::Unused);
                k
            }
            None => {
                let mut k: Vec<TokenKind> = tokens
                    .iter()
                    .map(|t| {
                        if t.is_some() {
                            TokenKind::Normal
                        } else {
                            TokenKind::Unused
                        }
                    })
                    .collect();
                for t in &p.added {
                    k[t.id as usize] = if t.special {
                        TokenKind::Control
                    } else {
                        TokenKind::UserDefined
                    };
                }
                k
            }
        };

        let mut decoded = Vec::new();
        let mut decoded_at = Vec::with_capacity(n_ids + 1);
        for t in &tokens {
            decoded_at.push(decoded.len() as u32);
            if let Some(t) = t {
                decoded.extend(bytelevel::decode_token(t));
            }
        }
        decoded_at.push(decoded.len() as u32);

        let vocab_id = |context: &'static str, s: &str| {
            p.model_vocab
                .get(s)
                .copied()
                .ok_or_else(|| TokenizerError::NotInVocab {
                    context,
                    token: s.to_string(),
                })
        };
        let mut merges = MergeMap::with_capacity_and_hasher(p.merges.len(), Default::default());
        let mut joined = String::new();
        for (rank, (a, b)) in p.merges.iter().enumerate() {
            let (ia, ib) = (vocab_id("merge token", a)?, vocab_id("merge token", b)?);
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let new_id = vocab_id("merge result", &joined)?;
            // Like HF's collect into a map: a repeated pair keeps its last rank.
            merges.insert(pair_key(ia, ib), (rank as u32, new_id));
        }
        let mut byte_ids = [None; 256];
        let mut buf = [0u8; 4];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            *id = p
                .model_vocab
                .get(&*bytelevel::BYTE_TO_CHAR[b].encode_utf8(&mut buf))
                .copied();
        }

        let added_ids = p.added.iter().map(|t| (t.content.clone(), t.id)).collect();
        Ok(Tokenizer {
            tokens,
            kinds,
            model_vocab: p.model_vocab,
            added_ids,
            decoded,
            decoded_at,
            bpe: Bpe {
                byte_ids,
                merges,
                ignore_merges: p.ignore_merges,
                unk: p.unk,
            },
            added: AddedVocab::new(p.added),
            pre: p.pre,
            special: p.special,
            prefix: p.prefix,
            suffix: p.suffix,
        })
    }

    /// Token ids of `text` (any bytes). With `add_special`, the BOS (and whatever else the
    /// tokenizer's template adds) is included; a rendered chat template already starts
    /// with the literal BOS text, so encode it with `add_special = false`.
    pub fn encode(&self, text: &[u8], add_special: bool) -> Vec<u32> {
        self.encode_with(
            text,
            EncodeOptions {
                add_special,
                split_special: false,
            },
        )
    }

    pub fn encode_with(&self, text: &[u8], opts: EncodeOptions) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + self.prefix.len() + self.suffix.len());
        self.encode_into(text, opts, &mut out);
        out
    }

    /// Appends the ids of `text` to `out`.
    pub fn encode_into(&self, text: &[u8], opts: EncodeOptions, out: &mut Vec<u32>) {
        if opts.add_special {
            out.extend_from_slice(&self.prefix);
        }
        let mut segments = Vec::new();
        self.added.split(text, opts.split_special, &mut segments);
        let mut scratch = Scratch::new();
        for seg in segments {
            match seg {
                Segment::Token(id) => out.push(id),
                Segment::Text(r) => {
                    let base = r.start;
                    self.pre.for_each_piece(&text[r], |p| {
                        let piece = &text[base + p.start..base + p.end];
                        self.bpe
                            .encode_piece(piece, &self.model_vocab, &mut scratch, out);
                    });
                }
            }
        }
        if opts.add_special {
            out.extend_from_slice(&self.suffix);
        }
    }

    /// The bytes of `ids` (unknown ids are skipped, as HF does). HF returns
    /// `String::from_utf8_lossy` of these bytes; they are returned raw here so that
    /// invalid UTF-8 input round-trips.
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        self.decode_with(ids, false)
    }

    /// [`decode`](Self::decode), leaving out special tokens when `skip_special` is set
    /// (HF `skip_special_tokens`).
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            if let Some(b) = self.token_bytes(id) {
                out.extend_from_slice(b);
            }
        }
        out
    }

    /// The bytes token `id` decodes to (`None` for unknown ids).
    #[inline]
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if i >= self.tokens.len() || self.tokens[i].is_none() {
            return None;
        }
        Some(&self.decoded[self.decoded_at[i] as usize..self.decoded_at[i + 1] as usize])
    }

    /// The id of a vocabulary string (byte-level spelling, e.g. `Ġthe`, or an added
    /// token's content such as `<think>`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added_ids
            .get(token)
            .or_else(|| self.model_vocab.get(token))
            .copied()
    }

    /// The vocabulary string of `id`.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize)?.as_deref()
    }

    /// Number of ids (one more than the largest id).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn kind(&self, id: u32) -> TokenKind {
        self.kinds
            .get(id as usize)
            .copied()
            .unwrap_or(TokenKind::Unused)
    }

    /// Whether `id` is a special token: HF `special = true` added tokens, GGUF CONTROL /
    /// UNKNOWN tokens. These are what `skip_special` leaves out.
    pub fn is_special(&self, id: u32) -> bool {
        matches!(self.kind(id), TokenKind::Control | TokenKind::Unknown)
    }

    pub fn special_ids(&self) -> SpecialIds {
        self.special
    }

    /// Overrides the ids with a role (e.g. an end-of-turn id known from elsewhere).
    pub fn set_special_ids(&mut self, ids: SpecialIds) {
        self.special = ids;
    }

    pub fn bos(&self) -> Option<u32> {
        self.special.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.special.eos
    }

    pub fn eot(&self) -> Option<u32> {
        self.special.eot
    }

    /// EOS or end of turn: where generation stops.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        Some(id) == self.special.eos || Some(id) == self.special.eot
    }

    /// Ids [`encode`](Self::encode) puts before / after the text when `add_special` is set.
    pub fn special_prefix(&self) -> &[u32] {
        &self.prefix
    }

    pub fn special_suffix(&self) -> &[u32] {
        &self.suffix
    }

    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// The added tokens (matched in raw text before pre-tokenization).
    pub fn added_tokens(&self) -> &[AddedToken] {
        &self.added.tokens
    }
}
