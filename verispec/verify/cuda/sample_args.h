// sample_args.h: the arguments of one verify_sample launch (vs_verify_sample in verify_sample.cu),
// filled by binding.cpp from the torch tensors. Plain C types only: included by nvcc and by the C++
// compiler alike.
#pragma once

struct VsSampleArgs {
    const void* logits;
    int dtype;
    long long row_stride;
    int rows, vocab, batch, width;
    const long long* draft_tokens;
    const void* draft_probs;  // null: point-mass drafts
    int q_dtype;
    long long q_stride;
    int check_q;  // pass 1 also checks every q row (reads them)
    const int* num_draft;
    const int* cu_num_draft;
    const float* temperature;
    const int* top_k;
    const float* top_p;
    const long long* seed;
    const long long* offset;
    int chunks;  // pass-1 chunks
    float *part_a, *part_s, *part_qsum;
    int *part_idx, *part_flag;
    int race_chunks;  // pass 2's vocabulary chunks a sequence (1: one block per sequence)
    float *race_p_val, *race_res_val;
    int *race_p_idx, *race_res_idx, *race_any, *race_acc, *race_flags;
    int *tokens, *num_accepted, *num_emitted, *status;
};
