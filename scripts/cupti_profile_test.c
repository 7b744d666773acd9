// Tests of cupti_profile.c's bookkeeping without a GPU: hand-made activity records go through
// record(), and the summary it writes must hold their totals. `cargo xtask clippy-cuda` builds
// and runs it (CI); it exits non-zero and says what differed.

#include "cupti_profile.c"

static int failures;

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "cupti_profile_test: FAILED: %s\n", what);
        failures++;
    }
}

static void kernel(const char *name, uint64_t start, uint64_t end) {
    CUpti_ActivityKernel10 k;
    memset(&k, 0, sizeof k);
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.name = name;
    k.start = start;
    k.end = end;
    record((const CUpti_Activity *)&k);
}

static void api(CUpti_ActivityKind kind, uint32_t cbid, uint64_t start, uint64_t end) {
    CUpti_ActivityAPI a;
    memset(&a, 0, sizeof a);
    a.kind = kind;
    a.cbid = cbid;
    a.start = start;
    a.end = end;
    record((const CUpti_Activity *)&a);
}

int main(void) {
    const uint64_t MS = 1000000u, S = 1000000000u;
    origin_ns = 10 * S;
    kernel("gemm", origin_ns + 1 * MS, origin_ns + 4 * MS);
    kernel("softmax", origin_ns + 5 * MS, origin_ns + 7 * MS);
    kernel("gemm", origin_ns + S + 1 * MS, origin_ns + S + 2 * MS);
    CUpti_ActivityMemcpy6 m;
    memset(&m, 0, sizeof m);
    m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
    m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
    m.bytes = 2000000;
    m.start = origin_ns + 8 * MS;
    m.end = origin_ns + 9 * MS;
    record((const CUpti_Activity *)&m);
    CUpti_ActivitySynchronization2 s;
    memset(&s, 0, sizeof s);
    s.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    s.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
    s.start = origin_ns;
    s.end = origin_ns + 5 * MS;
    record((const CUpti_Activity *)&s);
    for (int i = 0; i < 4; i++)
        api(CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, origin_ns, origin_ns + 2000);
    api(CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync, origin_ns, origin_ns + 50000);

    expect(first_ns == origin_ns + 1 * MS && last_ns == origin_ns + S + 2 * MS, "the span of the GPU records");
    expect(kernel_ns_per_second[0] == 5 * MS && launches_per_second[0] == 2, "second 0: 5 ms in 2 launches");
    expect(kernel_ns_per_second[1] == 1 * MS && launches_per_second[1] == 1, "second 1: 1 ms in 1 launch");
    expect(copies[CUPTI_ACTIVITY_MEMCPY_KIND_HTOD].bytes == 2000000, "host-to-device bytes");
    expect(driver_api[CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel].count == 4, "four launches counted");

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    write_summary(f, 1);
    fclose(f);
    expect(strstr(text, "written at exit") != NULL, "a final summary says so");
    expect(strstr(text, "kernels ran 6.0 ms of it (0.6%;") != NULL, "kernel total in the summary");
    expect(strstr(text, "3 launches, 2 distinct") != NULL, "launch count in the summary");
    expect(strstr(text, "        4.0   66.7%          2    2000.00  gemm") != NULL, "gemm's row, first");
    expect(strstr(text, "2 launches, 2 distinct") == NULL, "no miscount");
    expect(strstr(text, "host to device") != NULL && strstr(text, "stream synchronize") != NULL, "copy and sync rows");
    expect(strstr(text, "cuLaunchKernel") != NULL, "driver API names from CUPTI");
    expect(strstr(text, "cuMemAllocAsync") < strstr(text, "cuLaunchKernel"), "API rows by total time");
    if (failures) fprintf(stderr, "%s\n", text);
    free(text);
    if (!failures) printf("cupti_profile_test: ok\n");
    return failures ? 1 : 0;
}
