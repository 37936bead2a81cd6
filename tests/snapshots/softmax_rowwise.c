/* trace: [{"kind": "ComputeAt", "stage": "m", "consumer": "Y", "loop": "i"}, {"kind": "Vectorize", "stage": "m", "loop": "j"}, {"kind": "ComputeAt", "stage": "e", "consumer": "Y", "loop": "i"}, {"kind": "Vectorize", "stage": "e", "loop": "j"}, {"kind": "ComputeAt", "stage": "s", "consumer": "Y", "loop": "i"}, {"kind": "ReduceEpilogue", "stage": "s", "producer": "e"}, {"kind": "InPlace", "stage": "e", "consumer": "Y"}, {"kind": "Parallel", "stage": "Y", "loop": "i"}, {"kind": "Vectorize", "stage": "Y", "loop": "j"}] */
void softmax_rowwise(void **args) {
    const float *restrict X = (const float *)args[0];
    float *restrict Y = (float *)args[1];
    /* Y[i,j] = (e[i,j] / s[i])  over(i:16 j:40) */
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < 16; ++i) {
        /* m[i] max= X[i,j]  over(i:16 j:40) */
        float m[1] __attribute__((aligned(64)));
        {
            float acc = (-INFINITY);
            int acc_nan = 0;
            #pragma omp simd reduction(max:acc) reduction(|:acc_nan)
            for (int m_j = 0; m_j < 40; ++m_j) {
                { float so_v = X[40*i + m_j]; acc = acc > so_v ? acc : so_v; acc_nan |= so_v != so_v; }
            }
            if (acc_nan) acc = NAN;
            m[0] = acc;
        }
        /* e[i,j] = exp((X[i,j] - m[i]))  over(i:16 j:40) */
        float s[1] __attribute__((aligned(64)));
        float s_acc = 0.0f;
        #pragma omp simd reduction(+:s_acc)
        for (int e_j = 0; e_j < 40; ++e_j) {
            Y[e_j + 40*i] = so_expf((X[e_j + 40*i] - m[0]));
            s_acc = s_acc + Y[e_j + 40*i];
        }
        s[0] = s_acc;
        #pragma omp simd
        for (int j = 0; j < 40; ++j) {
            Y[40*i + j] = (Y[40*i + j] / s[0]);
        }
    }
}
