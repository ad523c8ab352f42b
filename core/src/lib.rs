//! lagoon-core: the format- and backend-neutral heart of lagoon.
//!
//! Dtypes and quant blocks with their scalar reference decoders ([`quant`]), the model
//! configuration ([`config`]), weight views ([`weights`]), RoPE/YaRN tables ([`rope`]), the
//! tensor graph with its liveness planner ([`graph`]) and the Laguna graph builder
//! ([`laguna`]). `#![no_std]`; everything that needs a heap sits behind the `alloc` feature
//! (on by default).
#![no_std]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod dtype;
pub mod quant;
pub mod weights;

#[cfg(feature = "alloc")]
pub mod config;
#[cfg(feature = "alloc")]
pub mod graph;
#[cfg(feature = "alloc")]
pub mod laguna;
pub mod ops;
#[cfg(feature = "alloc")]
pub mod rope;
pub mod sample;
