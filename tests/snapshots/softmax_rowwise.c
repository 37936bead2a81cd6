/* trace: [{"kind": "Split", "stage": "Y", "loop": "i", "factor": 4}, {"kind": "ComputeAt", "stage": "m", "consumer": "Y", "loop": "i_i"}, {"kind": "Vectorize", "stage": "m", "loop": "j"}, {"kind": "ComputeAt", "stage": "e", "consumer": "Y", "loop": "i_i"}, {"kind": "Vectorize", "stage": "e", "loop": "j"}, {"kind": "ComputeAt", "stage": "s", "consumer": "Y", "loop": "i_i"}, {"kind": "ReduceEpilogue", "stage": "s", "producer": "e"}, {"kind": "InPlace", "stage": "e", "consumer": "Y"}, {"kind": "NextRow", "stage": "m", "into": "e"}, {"kind": "Parallel", "stage": "Y", "loop": "i_o"}, {"kind": "Vectorize", "stage": "Y", "loop": "j"}] */
void softmax_rowwise(void **args) {
    const float *restrict X = (const float *)args[0];
    float *restrict Y = (float *)args[1];
    /* Y[i,j] = (e[i,j] / s[i])  over(i:16 j:40) */
    #pragma omp parallel for schedule(guided) num_threads(SO_THREADS)
    for (int i_o = 0; i_o < 4; ++i_o) {
        float m_next = (-INFINITY);
        int m_next_nan = 0;
        for (int i_i = 0; i_i < 1; ++i_i) {
            /* m[i] max= X[i,j]  over(i:16 j:40) */
            float m[1] __attribute__((aligned(64)));
            {
                float acc = (-INFINITY);
                int acc_nan = 0;
                #pragma omp simd reduction(max:acc) reduction(|:acc_nan)
                for (int m_j = 0; m_j < 40; ++m_j) {
                    { float so_v = X[40*i_i + 160*i_o + m_j]; acc = acc > so_v ? acc : so_v; acc_nan |= so_v != so_v; }
                }
                if (acc_nan) acc = NAN;
                m[0] = acc;
            }
            m_next = m[0];
        }
        for (int i_i = 0; i_i < 3; ++i_i) {
            float m[1] __attribute__((aligned(64)));
            m[0] = m_next;
            /* e[i,j] = exp((X[i,j] - m[i]))  over(i:16 j:40) */
            float s[1] __attribute__((aligned(64)));
            float s_acc = 0.0f;
            m_next = (-INFINITY);
            m_next_nan = 0;
            #pragma omp simd reduction(+:s_acc) reduction(max:m_next) reduction(|:m_next_nan)
            for (int e_j = 0; e_j < 40; ++e_j) {
                Y[e_j + 40*i_i + 160*i_o] = so_expf((X[e_j + 40*i_i + 160*i_o] - m[0]));
                s_acc = s_acc + Y[e_j + 40*i_i + 160*i_o];
                { float so_v = X[e_j + 40*i_i + 160*i_o + 40]; m_next = m_next > so_v ? m_next : so_v; m_next_nan |= so_v != so_v; }
            }
            if (m_next_nan) m_next = NAN;
            s[0] = s_acc;
            #pragma omp simd
            for (int j = 0; j < 40; ++j) {
                Y[40*i_i + 160*i_o + j] = (Y[40*i_i + 160*i_o + j] / s[0]);
            }
        }
        for (int i_i = 0; i_i < 1; ++i_i) {
            float m[1] __attribute__((aligned(64)));
            m[0] = m_next;
            /* e[i,j] = exp((X[i,j] - m[i]))  over(i:16 j:40) */
            float s[1] __attribute__((aligned(64)));
            float s_acc = 0.0f;
            m_next = (-INFINITY);
            m_next_nan = 0;
            #pragma omp simd reduction(+:s_acc) reduction(max:m_next) reduction(|:m_next_nan)
            for (int e_j = 0; e_j < 40; ++e_j) {
                Y[e_j + 40*i_i + 160*i_o + 120] = so_expf((X[e_j + 40*i_i + 160*i_o + 120] - m[0]));
                s_acc = s_acc + Y[e_j + 40*i_i + 160*i_o + 120];
            }
            if (m_next_nan) m_next = NAN;
            s[0] = s_acc;
            #pragma omp simd
            for (int j = 0; j < 40; ++j) {
                Y[40*i_i + 160*i_o + j + 120] = (Y[40*i_i + 160*i_o + j + 120] / s[0]);
            }
        }
    }
}
