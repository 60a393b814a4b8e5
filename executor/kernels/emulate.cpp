// Runs box_copy.cu's kernels on the host, every block and every thread one
// after the other (the kernels share nothing between threads), so that
// tests check the kernels' code without a GPU. Built by
// executor/tests/kernels.rs with the host's C++ compiler.
//
// Usage: emulate copy|reduce DTYPE < input > output
// Input (little-endian u64s, then bytes): source length, destination
// length, item count; the source bytes; the destination bytes; the items,
// six u64s each, with `src` and `dst` as offsets into the two buffers.
// Output: the destination bytes after the launch.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct Dim3 {
    unsigned x, y, z;
};
static Dim3 threadIdx, blockIdx, blockDim;

#define __global__
#define __device__
#include "box_copy.cu"

static bool read_all(void* p, size_t n) { return fread(p, 1, n, stdin) == n; }

// Buffers aligned as the driver aligns allocations, so the kernels pick
// the same load widths as on a GPU.
static unsigned char* buffer(u64 n) {
    void* p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    return static_cast<unsigned char*>(p);
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: emulate copy|reduce DTYPE < input > output\n");
        return 2;
    }
    const bool reduce = strcmp(argv[1], "reduce") == 0;
    const u32 dtype = (u32)strtoul(argv[2], nullptr, 10);
    u64 head[3];
    if (!read_all(head, sizeof head)) {
        fprintf(stderr, "emulate: short input\n");
        return 2;
    }
    unsigned char* src = buffer(head[0]);
    unsigned char* dst = buffer(head[1]);
    std::vector<Item> items(head[2]);
    if (!read_all(src, head[0]) || !read_all(dst, head[1]) ||
        !read_all(items.data(), items.size() * sizeof(Item))) {
        fprintf(stderr, "emulate: short input\n");
        return 2;
    }
    for (Item& it : items) {
        it.src += (u64)src;
        it.dst += (u64)dst;
    }
    blockDim = {256, 1, 1};
    for (u32 b = 0; b < items.size(); ++b) {
        blockIdx = {b, 0, 0};
        for (u32 t = 0; t < blockDim.x; ++t) {
            threadIdx = {t, 0, 0};
            if (reduce) {
                box_reduce(items.data(), dtype);
            } else {
                box_copy(items.data());
            }
        }
    }
    return fwrite(dst, 1, head[1], stdout) == head[1] ? 0 : 1;
}
