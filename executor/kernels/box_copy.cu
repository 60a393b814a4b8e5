// Box copies of a verified plan in one launch per GPU: each block performs
// one item, a 2-D copy (rows of `width` bytes, pitched by both sides), with
// the widest loads the item's alignment allows. `make cuda-ptx` (needs
// nvcc) compiles it to PTX for compute_75, which the driver compiles for the
// GPU at hand; executor/src/cuda.rs embeds box_copy.ptx.

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
