//! Element types of tensors.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The element type of a tensor. Plans never convert between types: a copy
/// moves elements of one type, so a buffer and every piece in it share one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
#[non_exhaustive]
pub enum DType {
    /// 64-bit IEEE float.
    F64,
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit signed integer.
    I64,
    /// 32-bit signed integer.
    I32,
    /// 8-bit unsigned integer.
    U8,
}

impl DType {
    /// Every type, in a fixed order.
    pub const ALL: [DType; 7] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::U8,
    ];

    /// Size of one element in bytes.
    pub fn size(self) -> u64 {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// `dst[i] += src[i]` for every element of two equal-length byte slices
    /// of this type (little-endian): IEEE addition for floats (bf16 and f16
    /// through f32, rounded to nearest even), wrapping addition for integers.
    /// This is what a reduce-copy does.
    pub fn add_assign(self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "add_assign needs equal lengths");
        macro_rules! lanes {
            ($n:literal, $t:ty, $op:expr) => {
                for (d, s) in dst.chunks_exact_mut($n).zip(src.chunks_exact($n)) {
                    let a = <$t>::from_le_bytes(d.try_into().expect("lane"));
                    let b = <$t>::from_le_bytes(s.try_into().expect("lane"));
                    let f: fn($t, $t) -> $t = $op;
                    d.copy_from_slice(&f(a, b).to_le_bytes());
                }
            };
        }
        match self {
            DType::F64 => lanes!(8, f64, |a, b| a + b),
            DType::F32 => lanes!(4, f32, |a, b| a + b),
            DType::BF16 => lanes!(2, u16, |a, b| bf16_from_f32(bf16_to_f32(a) + bf16_to_f32(b))),
            DType::F16 => lanes!(2, u16, |a, b| f16_from_f32(f16_to_f32(a) + f16_to_f32(b))),
            DType::I64 => lanes!(8, i64, |a, b| a.wrapping_add(b)),
            DType::I32 => lanes!(4, i32, |a, b| a.wrapping_add(b)),
            DType::U8 => lanes!(1, u8, |a, b| a.wrapping_add(b)),
        }
    }

    /// Whether this is a floating-point type (the types [`DType::convert`]
    /// converts between).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::BF16)
    }

    /// Whether converting this type's values to `to` can lose information
    /// (precision or range): f32 to bf16 or f16, f16 and bf16 to each
    /// other, f64 to anything narrower. Widening is exact.
    pub fn narrows_to(self, to: DType) -> bool {
        match (self, to) {
            (a, b) if a == b => false,
            (DType::F16 | DType::BF16, DType::F32 | DType::F64) | (DType::F32, DType::F64) => false,
            _ => true,
        }
    }

    /// Convert `src`, elements of this type, into `dst`, elements of `to`
    /// (both little-endian, the same number of elements): floating-point
    /// types only, rounded to nearest even as PyTorch's `Tensor.to` does
    /// (f64 goes through f32, as PyTorch's bf16 and f16 conversions do).
    /// Returns `false`, writing nothing, for a non-float type or mismatched
    /// lengths.
    pub fn convert(self, to: DType, src: &[u8], dst: &mut [u8]) -> bool {
        if !self.is_float() || !to.is_float() {
            return false;
        }
        let (a, b) = (self.size() as usize, to.size() as usize);
        if !src.len().is_multiple_of(a) || dst.len() != src.len() / a * b {
            return false;
        }
        for (s, d) in src.chunks_exact(a).zip(dst.chunks_exact_mut(b)) {
            let wide = match self {
                DType::F64 => f64::from_le_bytes(s.try_into().expect("lane")),
                DType::F32 => f64::from(f32::from_le_bytes(s.try_into().expect("lane"))),
                DType::F16 => f64::from(f16_to_f32(u16::from_le_bytes([s[0], s[1]]))),
                _ => f64::from(bf16_to_f32(u16::from_le_bytes([s[0], s[1]]))),
            };
            match to {
                DType::F64 => d.copy_from_slice(&wide.to_le_bytes()),
                DType::F32 => d.copy_from_slice(&(wide as f32).to_le_bytes()),
                DType::F16 => d.copy_from_slice(&f16_from_f32(wide as f32).to_le_bytes()),
                _ => d.copy_from_slice(&bf16_from_f32(wide as f32).to_le_bytes()),
            }
        }
        true
    }

    /// The lowercase name used in layouts, plans and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = Error;

    /// Accepts the lowercase names and safetensors' uppercase ones (`F32`, `BF16`).
    fn from_str(s: &str) -> Result<Self, Error> {
        let lower = s.to_ascii_lowercase();
        DType::ALL
            .into_iter()
            .find(|d| d.as_str() == lower)
            .ok_or_else(|| Error::UnknownDType { name: s.to_string() })
    }
}

impl TryFrom<String> for DType {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        s.parse()
    }
}

impl From<DType> for String {
    fn from(d: DType) -> String {
        d.as_str().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_between_floats_rounding_to_nearest_even() {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        // 1 + 2^-8 is exactly between two bf16 values: ties go to even (1.0);
        // 1 + 3 * 2^-9 rounds up to 1 + 2^-7.
        let src = f32s(&[1.0, 1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-9), -2.5, f32::INFINITY]);
        let mut bf = vec![0u8; 10];
        assert!(DType::F32.convert(DType::BF16, &src, &mut bf));
        let back: Vec<f32> = bf
            .chunks_exact(2)
            .map(|h| bf16_to_f32(u16::from_le_bytes([h[0], h[1]])))
            .collect();
        assert_eq!(back, [1.0, 1.0, 1.0 + 2f32.powi(-7), -2.5, f32::INFINITY]);
        // Widening back is exact.
        let mut wide = vec![0u8; 20];
        assert!(DType::BF16.convert(DType::F32, &bf, &mut wide));
        assert_eq!(wide, f32s(&back));
        // Integers, and a destination of the wrong length, are refused.
        assert!(!DType::I32.convert(DType::F32, &[0; 4], &mut [0; 4]));
        assert!(!DType::F32.convert(DType::BF16, &src, &mut [0; 4]));
        assert!(DType::F32.narrows_to(DType::BF16) && DType::BF16.narrows_to(DType::F16));
        assert!(!DType::BF16.narrows_to(DType::F32) && !DType::F32.narrows_to(DType::F32));
    }

    #[test]
    fn round_trips_through_strings() {
        for d in DType::ALL {
            assert_eq!(d.to_string().parse::<DType>().unwrap(), d);
            assert_eq!(d.as_str().to_uppercase().parse::<DType>().unwrap(), d);
        }
        assert!("f8".parse::<DType>().is_err());
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::I64.size(), 8);
    }
}

/// bfloat16 bits to f32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// f32 to bfloat16 bits, rounded to nearest even (NaN stays NaN).
pub fn bf16_from_f32(f: f32) -> u16 {
    let b = f.to_bits();
    if f.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// IEEE half bits to f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f32::from(h & 0x3ff);
    match exp {
        0 => sign * man * (-24f32).exp2(),
        31 if man == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        e => sign * (1.0 + man / 1024.0) * ((e - 15) as f32).exp2(),
    }
}

/// f32 to IEEE half bits, rounded to nearest even; overflow gives infinity.
pub fn f16_from_f32(f: f32) -> u16 {
    let sign: u16 = if f.is_sign_negative() { 0x8000 } else { 0 };
    let a = f.abs();
    if a.is_nan() {
        return 0x7e00;
    }
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    if a < (-14f32).exp2() {
        // Subnormal: a multiple of 2^-24, rounded to nearest even.
        return sign | (a * 24f32.exp2()).round_ties_even() as u16;
    }
    let e = a.log2().floor() as i32;
    // log2 can be off by one near powers of two.
    let e = if (e as f32).exp2() > a {
        e - 1
    } else if ((e + 1) as f32).exp2() <= a {
        e + 1
    } else {
        e
    };
    let m = (a / (e as f32).exp2() - 1.0) * 1024.0;
    let m = m.round_ties_even() as u32;
    let (e, m) = if m == 1024 { (e + 1, 0) } else { (e, m) };
    if e > 15 {
        return sign | 0x7c00;
    }
    sign | (((e + 15) as u16) << 10) | m as u16
}

#[cfg(test)]
mod add_tests {
    use super::*;

    #[test]
    fn halves_round_trip_and_add() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if !f.is_nan() {
                assert_eq!(f16_from_f32(f), h, "f16 {h:#06x}");
            }
            let g = bf16_to_f32(h);
            if !g.is_nan() {
                assert_eq!(bf16_from_f32(g), h, "bf16 {h:#06x}");
            }
        }
        assert_eq!(f16_to_f32(f16_from_f32(1.0 + 1.0 / 4096.0)), 1.0, "ties to even");
        let mut a = [f16_from_f32(1.5).to_le_bytes(), f16_from_f32(-3.0).to_le_bytes()].concat();
        let b = [f16_from_f32(2.25).to_le_bytes(), f16_from_f32(1.0).to_le_bytes()].concat();
        DType::F16.add_assign(&mut a, &b);
        assert_eq!(f16_to_f32(u16::from_le_bytes([a[0], a[1]])), 3.75);
        assert_eq!(f16_to_f32(u16::from_le_bytes([a[2], a[3]])), -2.0);
        let mut x = 250u8.to_le_bytes();
        DType::U8.add_assign(&mut x, &[10]);
        assert_eq!(x, [4]);
        let mut y = [bf16_from_f32(2.0).to_le_bytes(), [0, 0]].concat();
        DType::BF16.add_assign(
            &mut y,
            &[bf16_from_f32(0.5).to_le_bytes(), bf16_from_f32(-1.0).to_le_bytes()].concat(),
        );
        assert_eq!(bf16_to_f32(u16::from_le_bytes([y[0], y[1]])), 2.5);
        assert_eq!(bf16_to_f32(u16::from_le_bytes([y[2], y[3]])), -1.0);
    }
}
