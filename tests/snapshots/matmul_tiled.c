/* trace: [{"kind": "Split", "stage": "C", "loop": "i", "factor": 4}, {"kind": "Split", "stage": "C", "loop": "j", "factor": 32}, {"kind": "Reorder", "stage": "C", "order": ["i_o", "j_o", "k", "i_i", "j_i"]}, {"kind": "CacheWrite", "stage": "C", "at": "k"}, {"kind": "Unroll", "stage": "C", "loop": "i_i"}, {"kind": "Vectorize", "stage": "C", "loop": "j_i"}, {"kind": "Parallel", "stage": "C", "loop": "i_o"}, {"kind": "Pack", "stage": "B", "perm": [0, 1], "split_axis": 1, "factor": 32}] */
void matmul_tiled(void **args) {
    const float *restrict A = (const float *)args[0];
    const float *restrict B = (const float *)args[1];
    float *restrict C = (float *)args[2];
    /* C[i,j] += (A[i,k] * B[k,j])  over(i:64 j:64 k:48) */
    #pragma omp parallel for schedule(guided) num_threads(SO_THREADS)
    for (int i_o = 0; i_o < 16; ++i_o) {
        for (int j_o = 0; j_o < 2; ++j_o) {
            {
                so_v16 acc_vec[8];
                for (int so_i = 0; so_i < 8; ++so_i) acc_vec[so_i] = (so_v16){0} + 0.0f;
                for (int k = 0; k < 48; ++k) {
                    #pragma GCC unroll 4
                    for (int i_i = 0; i_i < 4; ++i_i) {
                        #pragma GCC unroll 2
                        for (int j_i_vec = 0; j_i_vec < 2; ++j_i_vec) {
                            const int j_i = 16 * j_i_vec;
                            acc_vec[2*i_i + j_i_vec] = acc_vec[2*i_i + j_i_vec] + (A[48*i_i + 192*i_o + k] * so_ld16(&B[j_i + 1536*j_o + 32*k]));
                        }
                    }
                }
                #pragma GCC unroll 4
                for (int i_i = 0; i_i < 4; ++i_i) {
                    #pragma GCC unroll 2
                    for (int j_i_vec = 0; j_i_vec < 2; ++j_i_vec) {
                        const int j_i = 16 * j_i_vec;
                        so_st16(&C[64*i_i + 256*i_o + j_i + 32*j_o], acc_vec[2*i_i + j_i_vec]);
                    }
                }
            }
        }
    }
}

void matmul_tiled_pack_B(const void *src_, void *dst_) {
    const float *restrict src = (const float *)src_;
    float *restrict dst = (float *)dst_;
    for (int a0 = 0; a0 < 2; ++a0)
        for (int a1 = 0; a1 < 48; ++a1)
            for (int a2 = 0; a2 < 32; ++a2)
                dst[(((0) * 2 + a0) * 48 + a1) * 32 + a2] = src[((0) * 48 + a1) * 64 + (a0 * 32 + a2)];
}
