// Every kernel's start and end on the GPU, CUDA graph nodes included, written to $TIMELINE_OUT
// (one "start_ns end_ns graph_node name" line a kernel) when the process exits. Loaded by the
// CUDA driver itself through CUDA_INJECTION64_PATH, so the binary under test is unchanged
// (scripts/build-cuda.sh builds it into .gpu/timeline.so; scripts/gpu_timeline.sh loads it):
//
//   CUDA_INJECTION64_PATH=$PWD/.gpu/timeline.so TIMELINE_OUT=k.txt unmask bench ...
//
// Written by hand because the GPU host has no Nsight Systems (scripts/gpu_timeline.sh reads the
// file). CUPTI's concurrent-kernel records keep kernels overlapping as they ran, so the times
// show what programmatic dependent launch overlaps.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE* out;

static void CUPTIAPI requested(uint8_t** buf, size_t* size, size_t* max_records) {
    *size = 8 << 20;
    *buf = (uint8_t*)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t* buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity* r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)r;
        if (out) fprintf(out, "%llu %llu %llu %s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                         (unsigned long long)k->graphNodeId, k->name ? k->name : "?");
    }
    free(buf);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

int InitializeInjection(void) {
    const char* path = getenv("TIMELINE_OUT");
    out = fopen(path ? path : "timeline.txt", "w");
    if (!out) return 0;
    if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "cupti_timeline: CUPTI refused the kernel activity\n");
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
