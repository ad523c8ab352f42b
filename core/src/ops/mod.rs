//! Scalar reference kernels, in f32. They define the numerics every fast kernel is tested
//! against, and they are what `--reference` runs.

pub mod attention;
pub mod matmul;
pub mod norm;
pub mod router;

/// `silu(g) · u`, elementwise (the SwiGLU of the dense MLP and of every expert).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// `z · sigmoid(z)`.
#[inline]
pub fn silu(z: f32) -> f32 {
    z / (1.0 + libm::expf(-z))
}

/// `log(1 + exp(z))`, with torch's default threshold: returns `z` when `z > 20`.
#[inline]
pub fn softplus(z: f32) -> f32 {
    if z > 20.0 {
        z
    } else {
        libm::log1pf(libm::expf(z))
    }
}

/// `1 / (1 + exp(-z))`.
#[inline]
pub fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + libm::expf(-z))
}

/// Plain dot product, summed in order.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        s += x * y;
    }
    s
}
