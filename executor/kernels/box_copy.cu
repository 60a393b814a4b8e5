// Box copies and reduce-copies of a verified plan, a few launches per GPU:
// each block performs one item, a 2-D copy (rows of `width` bytes, pitched
// by both sides). `box_copy` copies with the widest loads the item's
// alignment allows; `box_reduce` adds the source into the destination,
// element by element, as the host executor does (DType::add_assign).
// `make cuda-ptx` (nvcc, from the CUDA toolkit or PyPI's nvidia-cuda-nvcc)
// compiles it to PTX for compute_75, which the driver compiles for the GPU
// at hand; executor/src/cuda.rs embeds box_copy.ptx. Included by
// executor/kernels/emulate.cpp, the same code runs on the host, one thread
// at a time, so tests check it without a GPU.

typedef unsigned long long u64;
typedef unsigned int u32;


struct __attribute__((aligned(16))) V16 { u32 x, y, z, w; };
struct __attribute__((aligned(8))) V8 { u32 x, y; };

struct Item {
    u64 src;
    u64 dst;
    u64 width;
    u64 rows;
    u64 src_pitch;
    u64 dst_pitch;
};

// Threads split a row when it is wide, rows when they are narrow; each
// thread keeps four loads in flight before it stores.
template <typename T>
__device__ static inline void copy_rows(const Item& it) {
    const u32 tid = threadIdx.x;
    const u32 threads = blockDim.x;
    const u64 n = it.width / sizeof(T);
    if (n >= threads) {
        for (u64 r = 0; r < it.rows; ++r) {
            const T* __restrict__ s = reinterpret_cast<const T*>(it.src + r * it.src_pitch);
            T* __restrict__ d = reinterpret_cast<T*>(it.dst + r * it.dst_pitch);
            u64 c = tid;
            for (; c + 3 * threads < n; c += 4 * threads) {
                T a = s[c], b = s[c + threads], e = s[c + 2 * threads], f = s[c + 3 * threads];
                d[c] = a;
                d[c + threads] = b;
                d[c + 2 * threads] = e;
                d[c + 3 * threads] = f;
            }
            for (; c < n; c += threads) {
                d[c] = s[c];
            }
        }
    } else {
        const u32 per = threads / (u32)n;  // rows per pass
        const u32 r0 = tid / (u32)n;
        const u32 c = tid - r0 * (u32)n;
        if (r0 >= per) {
            return;
        }
        for (u64 r = r0; r < it.rows; r += per) {
            reinterpret_cast<T*>(it.dst + r * it.dst_pitch)[c] =
                reinterpret_cast<const T*>(it.src + r * it.src_pitch)[c];
        }
    }
}

extern "C" __global__ void box_copy(const Item* items) {
    const Item it = items[blockIdx.x];
    const u64 a = it.src | it.dst | it.width | it.src_pitch | it.dst_pitch;
    if ((a & 15) == 0) {
        copy_rows<V16>(it);
    } else if ((a & 7) == 0) {
        copy_rows<V8>(it);
    } else if ((a & 3) == 0) {
        copy_rows<u32>(it);
    } else if ((a & 1) == 0) {
        copy_rows<unsigned short>(it);
    } else {
        copy_rows<unsigned char>(it);
    }
}

// ---- Reduce-copies -------------------------------------------------------

// Element types, numbered as executor/src/cuda.rs numbers DType.
enum : u32 { T_F64 = 0, T_F32 = 1, T_F16 = 2, T_BF16 = 3, T_I64 = 4, T_I32 = 5, T_U8 = 6 };

#ifdef __CUDACC__
__device__ static inline u32 bits_of(float f) { return __float_as_uint(f); }
__device__ static inline float float_of(u32 b) { return __uint_as_float(b); }
#else
static inline u32 bits_of(float f) { u32 b; __builtin_memcpy(&b, &f, 4); return b; }
static inline float float_of(u32 b) { float f; __builtin_memcpy(&f, &b, 4); return f; }
#endif

// Half and bfloat16 conversions in integer arithmetic, so that the GPU and
// the host emulation run the same code and agree with ptc's dtype.rs bit for
// bit (rounding to nearest even; a NaN result as the host encodes it).
__device__ static inline float f16_to_f32(u32 h) {
    const u32 sign = (h & 0x8000u) << 16;
    const u32 exp = (h >> 10) & 0x1fu;
    const u32 man = h & 0x3ffu;
    if (exp == 0) {
        // Zero or subnormal: man * 2^-24, exact in f32.
        return float_of(bits_of((float)man * 5.9604644775390625e-8f) | sign);
    }
    if (exp == 31) {
        return float_of(sign | 0x7f800000u | (man << 13));
    }
    return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

__device__ static inline u32 f16_from_f32(float f) {
    const u32 x = bits_of(f);
    const u32 sign = (x >> 16) & 0x8000u;
    const u32 a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return 0x7e00u;  // NaN
    }
    if (a >= 0x477ff000u) {
        return sign | 0x7c00u;  // 65520 and above round to infinity
    }
    if (a < 0x38800000u) {
        // Below 2^-14: a multiple of 2^-24.
        const u32 e = a >> 23;
        if (e < 102u) {
            return sign;  // below 2^-25: rounds to zero
        }
        const u32 m = (a & 0x7fffffu) | 0x800000u;
        const u32 shift = 126u - e;
        u32 r = m >> shift;
        const u32 rest = m & ((1u << shift) - 1u);
        const u32 half = 1u << (shift - 1u);
        if (rest > half || (rest == half && (r & 1u))) {
            ++r;
        }
        return sign | r;
    }
    u32 r = (((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13);
    const u32 rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) {
        ++r;  // a carry into the exponent is right
    }
    return sign | r;
}

__device__ static inline u32 bf16_from_f32(float f) {
    const u32 b = bits_of(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b >> 16) | 0x40u;  // NaN stays NaN
    }
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}

struct AddF64 { __device__ double operator()(double a, double b) const { return a + b; } };
struct AddF32 { __device__ float operator()(float a, float b) const { return a + b; } };
struct AddF16 {
    __device__ unsigned short operator()(unsigned short a, unsigned short b) const {
        return (unsigned short)f16_from_f32(f16_to_f32(a) + f16_to_f32(b));
    }
};
struct AddBF16 {
    __device__ unsigned short operator()(unsigned short a, unsigned short b) const {
        return (unsigned short)bf16_from_f32(float_of((u32)a << 16) + float_of((u32)b << 16));
    }
};
// Integers wrap (unsigned arithmetic: the same bits as two's complement).
template <typename T>
struct AddWrapping { __device__ T operator()(T a, T b) const { return (T)(a + b); } };

// dst += src over one item, element by element. An item holds at most
// 256 KiB (cuda.rs's ITEM_BYTES), so element indices fit 32 bits.
template <typename T, typename Add>
__device__ static inline void add_rows(const Item& it, Add add) {
    const u32 n = (u32)(it.width / sizeof(T));
    const u32 total = n * (u32)it.rows;
    for (u32 i = threadIdx.x; i < total; i += blockDim.x) {
        const u32 r = i / n;
        const u32 c = i - r * n;
        const T* s = reinterpret_cast<const T*>(it.src + r * it.src_pitch) + c;
        T* d = reinterpret_cast<T*>(it.dst + r * it.dst_pitch) + c;
        *d = add(*d, *s);
    }
}

// The launch's items all hold `dtype` and write disjoint bytes (cuda.rs
// puts two addends of one element in different launches).
extern "C" __global__ void box_reduce(const Item* items, u32 dtype) {
    const Item it = items[blockIdx.x];
    switch (dtype) {
    case T_F64: add_rows<double>(it, AddF64()); break;
    case T_F32: add_rows<float>(it, AddF32()); break;
    case T_F16: add_rows<unsigned short>(it, AddF16()); break;
    case T_BF16: add_rows<unsigned short>(it, AddBF16()); break;
    case T_I64: add_rows<u64>(it, AddWrapping<u64>()); break;
    case T_I32: add_rows<u32>(it, AddWrapping<u32>()); break;
    case T_U8: add_rows<unsigned char>(it, AddWrapping<unsigned char>()); break;
    default: break;
    }
}
