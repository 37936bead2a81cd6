/* trace: [{"kind": "Reorder", "stage": "P", "order": ["n", "y", "x", "co", "ci", "kh", "kw"]}, {"kind": "Split", "stage": "P", "loop": "x", "factor": 5}, {"kind": "Reorder", "stage": "P", "order": ["y", "x_o", "n", "ci", "kh", "kw", "x_i", "co"]}, {"kind": "CacheWrite", "stage": "P", "at": "ci"}, {"kind": "Unroll", "stage": "P", "loop": "x_i"}, {"kind": "Unroll", "stage": "P", "loop": "kw"}, {"kind": "Vectorize", "stage": "P", "loop": "co"}, {"kind": "Parallel", "stage": "P", "loop": "y"}, {"kind": "Pack", "stage": "W", "perm": [1, 2, 3, 0], "split_axis": -1, "factor": 1}, {"kind": "Inline", "stage": "T"}, {"kind": "Epilogue", "stage": "O", "producer": "P"}] */
void conv_bias_relu_epilogue(void **args) {
    const float *restrict X = (const float *)args[0];
    const float *restrict W = (const float *)args[1];
    const float *restrict B = (const float *)args[2];
    float *restrict O = (float *)args[3];
    /* P[n,co,y,x] += (X[n,ci,kh+y-1,kw+x-1] * W[co,ci,kh,kw])  over(n:1 co:32 y:10 x:10 ci:16 kh:3 kw:3)  pad(X=0.0) */
    #pragma omp parallel for schedule(guided) num_threads(SO_THREADS)
    for (int y = 0; y < 10; ++y) {
        for (int x_o = 0; x_o < 2; ++x_o) {
            for (int n = 0; n < 1; ++n) {
                {
                    so_v16 acc_vec[10];
                    for (int so_i = 0; so_i < 10; ++so_i) acc_vec[so_i] = (so_v16){0} + 0.0f;
                    for (int ci = 0; ci < 16; ++ci) {
                        for (int kh = 0; kh < 3; ++kh) {
                            #pragma GCC unroll 3
                            for (int kw = 0; kw < 3; ++kw) {
                                #pragma GCC unroll 5
                                for (int x_i = 0; x_i < 5; ++x_i) {
                                    #pragma GCC unroll 2
                                    for (int co_vec = 0; co_vec < 2; ++co_vec) {
                                        const int co = 16 * co_vec;
                                        acc_vec[co_vec + 2*x_i] = acc_vec[co_vec + 2*x_i] + (((kh + y - 1) >= 0 && (kh + y - 1) < 10 && (kw + x_i + 5*x_o - 1) >= 0 && (kw + x_i + 5*x_o - 1) < 10 ? X[100*ci + 10*kh + kw + 1600*n + x_i + 5*x_o + 10*y - 11] : 0.0f) * so_ld16(&W[288*ci + co + 96*kh + 32*kw]));
                                    }
                                }
                            }
                        }
                    }
                    #pragma GCC unroll 5
                    for (int x_i = 0; x_i < 5; ++x_i) {
                        #pragma GCC unroll 2
                        for (int co_vec = 0; co_vec < 2; ++co_vec) {
                            const int co = 16 * co_vec;
                            /* epilogue: O[n,co,y,x] = relu((P[n,co,y,x] + B[co]))  over(n:1 co:32 y:10 x:10) */
                            {
                                const so_v16 so_w = so_relu16((acc_vec[co_vec + 2*x_i] + so_ld16(&B[co])));
                                const int so_c = co;
                                for (int so_l = 0; so_l < 16; ++so_l) {
                                    const int co = so_c + so_l;
                                    O[100*co + 3200*n + x_i + 5*x_o + 10*y] = so_w[so_l];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

void conv_bias_relu_epilogue_pack_W(const void *src_, void *dst_) {
    const float *restrict src = (const float *)src_;
    float *restrict dst = (float *)dst_;
    for (int a0 = 0; a0 < 144; a0 += 16)
        for (int a3 = 0; a3 < 32; a3 += 16)
            so_transpose16(src + ((0) * 32 + a3) * 144 + a0, 144, dst + ((0) * 144 + a0) * 32 + a3, 32);
}
