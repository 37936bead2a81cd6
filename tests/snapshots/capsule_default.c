/* trace: [{"kind": "Reorder", "stage": "V", "order": ["n", "y", "x", "p", "o", "q", "kh", "kw", "i", "r"]}, {"kind": "Fuse", "stage": "V", "outer": "o", "inner": "q"}, {"kind": "Split", "stage": "V", "loop": "o_q", "factor": 48}, {"kind": "Split", "stage": "V", "loop": "n", "factor": 2}, {"kind": "Reorder", "stage": "V", "order": ["n_o", "o_q_o", "y", "x", "kh", "kw", "i", "r", "n_i", "p", "o_q_i"]}, {"kind": "CacheWrite", "stage": "V", "at": "kh"}, {"kind": "Unroll", "stage": "V", "loop": "n_i"}, {"kind": "Unroll", "stage": "V", "loop": "p"}, {"kind": "Vectorize", "stage": "V", "loop": "o_q_i"}, {"kind": "Parallel", "stage": "V", "loop": "n_o"}, {"kind": "Pack", "stage": "W", "perm": [0, 1, 2, 4, 3, 5], "split_axis": -1, "factor": 1}] */
void capsule_default(void **args) {
    const float *restrict P = (const float *)args[0];
    const float *restrict W = (const float *)args[1];
    float *restrict V = (float *)args[2];
    /* V[n,y,x,o,p,q] += (P[n,kh+2*y,kw+2*x,i,p,r] * W[kh,kw,i,o,r,q])  over(n:8 y:7 x:7 o:32 p:4 q:4 kh:3 kw:3 i:32 r:4) */
    #pragma omp parallel for schedule(guided) num_threads(SO_THREADS)
    for (int n_o = 0; n_o < 4; ++n_o) {
        /* o_q_o < 2: full register tiles, constant trip counts */
        for (int o_q_o = 0; o_q_o < 2; ++o_q_o) {
            for (int y = 0; y < 7; ++y) {
                for (int x = 0; x < 7; ++x) {
                    {
                        so_v16 acc_vec[24];
                        for (int so_i = 0; so_i < 24; ++so_i) acc_vec[so_i] = (so_v16){0} + 0.0f;
                        for (int kh = 0; kh < 3; ++kh) {
                            for (int kw = 0; kw < 3; ++kw) {
                                for (int i = 0; i < 32; ++i) {
                                    for (int r = 0; r < 4; ++r) {
                                        #pragma GCC unroll 2
                                        for (int n_i = 0; n_i < 2; ++n_i) {
                                            #pragma GCC unroll 4
                                            for (int p = 0; p < 4; ++p) {
                                                #pragma GCC unroll 3
                                                for (int o_q_i_vec = 0; o_q_i_vec < 3; ++o_q_i_vec) {
                                                    const int o_q_i = 16 * o_q_i_vec;
                                                    acc_vec[12*n_i + o_q_i_vec + 3*p] = acc_vec[12*n_i + o_q_i_vec + 3*p] + (P[16*i + 7680*kh + 512*kw + 115200*n_i + 230400*n_o + 4*p + r + 1024*x + 15360*y] * so_ld16(&W[512*i + 49152*kh + 16384*kw + o_q_i + 48*o_q_o + 128*r]));
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                        #pragma GCC unroll 2
                        for (int n_i = 0; n_i < 2; ++n_i) {
                            #pragma GCC unroll 4
                            for (int p = 0; p < 4; ++p) {
                                #pragma GCC unroll 3
                                for (int o_q_i_vec = 0; o_q_i_vec < 3; ++o_q_i_vec) {
                                    const int o_q_i = 16 * o_q_i_vec;
                                    {
                                        const so_v16 so_w = acc_vec[12*n_i + o_q_i_vec + 3*p];
                                        const int so_c = o_q_i;
                                        for (int so_l = 0; so_l < 16; ++so_l) {
                                            const int o_q_i = so_c + so_l;
                                            V[25088*n_i + 50176*n_o + 192*o_q_o + 4*p + 512*x + 3584*y + (o_q_i % 4) + 16*(o_q_i / 4)] = so_w[so_l];
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        for (int o_q_o = 2; o_q_o < 3; ++o_q_o) {
            for (int y = 0; y < 7; ++y) {
                for (int x = 0; x < 7; ++x) {
                    {
                        so_v16 acc_vec[24];
                        for (int so_i = 0; so_i < 24; ++so_i) acc_vec[so_i] = (so_v16){0} + 0.0f;
                        for (int kh = 0; kh < 3; ++kh) {
                            for (int kw = 0; kw < 3; ++kw) {
                                for (int i = 0; i < 32; ++i) {
                                    for (int r = 0; r < 4; ++r) {
                                        #pragma GCC unroll 2
                                        for (int n_i = 0; n_i < 2; ++n_i) {
                                            #pragma GCC unroll 4
                                            for (int p = 0; p < 4; ++p) {
                                                #pragma GCC unroll 2
                                                for (int o_q_i_vec = 0; o_q_i_vec < 2; ++o_q_i_vec) {
                                                    const int o_q_i = 16 * o_q_i_vec;
                                                    acc_vec[12*n_i + o_q_i_vec + 3*p] = acc_vec[12*n_i + o_q_i_vec + 3*p] + (P[16*i + 7680*kh + 512*kw + 115200*n_i + 230400*n_o + 4*p + r + 1024*x + 15360*y] * so_ld16(&W[512*i + 49152*kh + 16384*kw + o_q_i + 48*o_q_o + 128*r]));
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                        #pragma GCC unroll 2
                        for (int n_i = 0; n_i < 2; ++n_i) {
                            #pragma GCC unroll 4
                            for (int p = 0; p < 4; ++p) {
                                #pragma GCC unroll 2
                                for (int o_q_i_vec = 0; o_q_i_vec < 2; ++o_q_i_vec) {
                                    const int o_q_i = 16 * o_q_i_vec;
                                    {
                                        const so_v16 so_w = acc_vec[12*n_i + o_q_i_vec + 3*p];
                                        const int so_c = o_q_i;
                                        for (int so_l = 0; so_l < 16; ++so_l) {
                                            const int o_q_i = so_c + so_l;
                                            V[25088*n_i + 50176*n_o + 192*o_q_o + 4*p + 512*x + 3584*y + (o_q_i % 4) + 16*(o_q_i / 4)] = so_w[so_l];
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

void capsule_default_pack_W(const void *src_, void *dst_) {
    const float *restrict src = (const float *)src_;
    float *restrict dst = (float *)dst_;
    #pragma omp parallel for schedule(guided) num_threads(SO_THREADS) collapse(2)
    for (int a0 = 0; a0 < 3; ++a0)
        for (int a1 = 0; a1 < 3; ++a1)
            for (int a2 = 0; a2 < 32; ++a2)
                for (int a3 = 0; a3 < 4; ++a3)
                    for (int a4 = 0; a4 < 32; ++a4)
                        for (int a5 = 0; a5 < 4; ++a5)
                            dst[((((((0) * 3 + a0) * 3 + a1) * 32 + a2) * 4 + a3) * 32 + a4) * 4 + a5] = src[((((((0) * 3 + a0) * 3 + a1) * 32 + a2) * 32 + a4) * 4 + a3) * 4 + a5];
}
