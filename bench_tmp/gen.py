import re, sys, os
d = sys.argv[1]
for name in ["bench_pw", "bench_inner", "bench_outer"]:
    src = open(f"{d}/{name}.cu").read()
    kname, gx, bx, by = open(f"{d}/{name}.launch").read().split()
    sig = src[src.index(kname + "(") + len(kname) + 1: src.index(") {", src.index(kname))]
    params = [p.strip() for p in sig.split(",")]
    decls, args = [], []
    for idx, p in enumerate(params):
        ty = p.split("*")[0].replace("const", "").strip()
        decls.append(f"  {ty}* p{idx}; cudaMalloc(&p{idx}, N * sizeof({ty})); fill<<<4096, 256>>>((unsigned char*)p{idx}, N * sizeof({ty}), {idx});")
        args.append(f"p{idx}")
    out = src.replace('extern "C" ', '') + f'''
#include <cstdio>
__global__ void fill(unsigned char* p, size_t bytes, int seed) {{
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes / 2; i += (size_t)gridDim.x * blockDim.x) {{
    unsigned h = (unsigned)(i * 2654435761u) ^ (seed * 97u);
    float f = ((h >> 8) & 0xffff) / 16384.0f - 2.0f;
    ((unsigned short*)p)[i] = (unsigned short)(__float_as_uint(f) >> 16);
  }}
}}
int main() {{
  const size_t N = 16384ull * 16384ull;
{chr(10).join(decls)}
  cudaDeviceSynchronize();
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int w = 0; w < 3; ++w) {kname}<<<dim3({gx}), dim3({bx}, {by})>>>({", ".join(args)});
  cudaEventRecord(a);
  const int iters = 30;
  for (int w = 0; w < iters; ++w) {kname}<<<dim3({gx}), dim3({bx}, {by})>>>({", ".join(args)});
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  printf("{name} grid %d block %dx%d: %.4f ms  err=%s\\n", {gx}, {bx}, {by}, ms / iters, cudaGetErrorString(cudaGetLastError()));
  void* c0; void* c1; cudaMalloc(&c0, N * 2); cudaMalloc(&c1, N * 2);
  cudaEventRecord(a);
  for (int w = 0; w < 10; ++w) cudaMemcpy(c1, c0, N * 2, cudaMemcpyDeviceToDevice);
  cudaEventRecord(b); cudaEventSynchronize(b);
  cudaEventElapsedTime(&ms, a, b);
  printf("  copy 512MB: %.4f ms = %.2f TB/s (r+w)\\n", ms / 10, 2.0 * N * 2 / (ms / 10 * 1e-3) / 1e12);
  return 0;
}}
'''
    os.makedirs("gen", exist_ok=True)
    open(f"gen/{name}.cu", "w").write(out)
