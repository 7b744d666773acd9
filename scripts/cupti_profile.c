// A kernel-level GPU profile of any CUDA process, without nsys: a CUPTI injection library. The CUDA
// driver loads it when CUDA_INJECTION64_PATH names it (at cuInit) and calls InitializeInjection;
// it then records every kernel, copy, memset, synchronisation and driver/runtime API call through
// CUPTI's activity API, and writes a summary to $RL_CUPTI_PROFILE_DIR/cupti-<pid>.txt (the
// current directory when unset) every $RL_CUPTI_PROFILE_EVERY_S seconds (5 by default; 0: only at
// exit), so a process that is killed rather than exiting leaves one too, and again at exit:
// the process's command line, the span from the first to the
// last record, time the GPU ran kernels against that span (and per second of the run, to tell a
// host-bound step from slow kernels), and the kernels, copies and API calls by total time.
// Built by `scripts/gpu-session.sh pack` against the CUDA 13.0 CUPTI wheel (xtask/src/cuda.rs),
// with that wheel's libcupti beside it (rpath $ORIGIN); `cargo xtask clippy-cuda` compiles it.

#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BUFFER_BYTES (8u << 20)
#define BUFFER_ALIGN 8u
#define NAMES 8192u      // distinct kernel names kept (open addressing; the rest go to "(other)")
#define SECONDS_KEPT 3600u
#define API_IDS 4096u    // callback ids kept per API domain

typedef struct {
    char *name;
    uint64_t count;
    uint64_t ns;
} Entry;

typedef struct {
    uint64_t count;
    uint64_t ns;
    uint64_t bytes;
} Total;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Entry kernels[NAMES];
static Total other_kernels;
static Total copies[16];
static Total memsets;
static Total syncs[8];
static Total overhead;
static Total driver_api[API_IDS];
static Total runtime_api[API_IDS];
static uint64_t origin_ns;  // when the driver loaded this library
static uint64_t first_ns = UINT64_MAX;
static uint64_t last_ns;
static uint64_t kernel_ns_per_second[SECONDS_KEPT];
static uint64_t launches_per_second[SECONDS_KEPT];
static uint64_t dropped;

static const char *const COPY_KINDS[16] = {
    "unknown", "host to device", "device to host", "host to array", "array to host", "array to array",
    "array to device", "device to array", "device to device", "host to host", "peer to peer",
};
static const char *const SYNC_KINDS[8] = {
    "unknown", "event synchronize", "stream wait event", "stream synchronize", "context synchronize",
};

static void add(Total *t, uint64_t start, uint64_t end, uint64_t bytes) {
    t->count += 1;
    t->ns += end > start ? end - start : 0;
    t->bytes += bytes;
}

static void span(uint64_t start, uint64_t end) {
    if (start < first_ns) first_ns = start;
    if (end > last_ns) last_ns = end;
}

// Kernel time per second since cuInit loaded this library.
static void per_second(uint64_t *table, uint64_t start, uint64_t amount) {
    uint64_t s = start > origin_ns ? (start - origin_ns) / 1000000000u : 0;
    if (s < SECONDS_KEPT) table[s] += amount;
}

static uint64_t hash(const char *s) {
    uint64_t h = 1469598103934665603u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

static void add_kernel(const char *name, uint64_t start, uint64_t end) {
    if (!name) name = "(unnamed)";
    uint64_t ns = end > start ? end - start : 0;
    for (uint64_t i = hash(name), probes = 0; probes < NAMES; i++, probes++) {
        Entry *e = &kernels[i % NAMES];
        if (!e->name) {
            e->name = strdup(name);
            if (!e->name) break;
        }
        if (strcmp(e->name, name) == 0) {
            e->count += 1;
            e->ns += ns;
            return;
        }
    }
    other_kernels.count += 1;
    other_kernels.ns += ns;
}

static void record(const CUpti_Activity *r) {
    switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        span(k->start, k->end);
        add_kernel(k->name, k->start, k->end);
        per_second(kernel_ns_per_second, k->start, k->end > k->start ? k->end - k->start : 0);
        per_second(launches_per_second, k->start, 1);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
        span(m->start, m->end);
        add(&copies[m->copyKind < 16 ? m->copyKind : 0], m->start, m->end, m->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
        span(m->start, m->end);
        add(&memsets, m->start, m->end, m->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        const CUpti_ActivitySynchronization2 *s = (const CUpti_ActivitySynchronization2 *)r;
        add(&syncs[(unsigned)s->type < 8 ? (unsigned)s->type : 0], s->start, s->end, 0);
        break;
    }
    case CUPTI_ACTIVITY_KIND_DRIVER:
    case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
        Total *table = r->kind == CUPTI_ACTIVITY_KIND_DRIVER ? driver_api : runtime_api;
        add(&table[a->cbid < API_IDS ? a->cbid : 0], a->start, a->end, 0);
        break;
    }
    case CUPTI_ACTIVITY_KIND_OVERHEAD: {
        const CUpti_ActivityOverhead3 *o = (const CUpti_ActivityOverhead3 *)r;
        add(&overhead, o->start, o->end, 0);
        break;
    }
    default:
        break;
    }
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(BUFFER_ALIGN, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) record(r);
    size_t lost = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &lost) == CUPTI_SUCCESS) dropped += lost;
    pthread_mutex_unlock(&lock);
    free(buffer);
    (void)size;
}

static int by_time(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    return (x->ns < y->ns) - (x->ns > y->ns);
}

static double ms(uint64_t ns) {
    return (double)ns / 1e6;
}

static void write_apis(FILE *f, const char *title, CUpti_CallbackDomain domain, Total *table) {
    Entry rows[API_IDS];
    size_t n = 0;
    uint64_t calls = 0, ns = 0;
    for (uint32_t id = 0; id < API_IDS; id++) {
        if (!table[id].count) continue;
        const char *name = NULL;
        if (cuptiGetCallbackName(domain, id, &name) != CUPTI_SUCCESS || !name) name = "(unknown)";
        rows[n++] = (Entry){(char *)name, table[id].count, table[id].ns};
        calls += table[id].count;
        ns += table[id].ns;
    }
    qsort(rows, n, sizeof rows[0], by_time);
    fprintf(f, "\n%s: %llu calls, %.1f ms on the host\n  total_ms      calls    mean_us  name\n", title,
            (unsigned long long)calls, ms(ns));
    for (size_t i = 0; i < n && i < 30; i++)
        fprintf(f, "  %9.1f %10llu %10.2f  %s\n", ms(rows[i].ns), (unsigned long long)rows[i].count,
                (double)rows[i].ns / 1e3 / (double)rows[i].count, rows[i].name);
}

static void write_summary(FILE *f, int final) {
    char cmdline[2048] = "";
    FILE *c = fopen("/proc/self/cmdline", "r");
    if (c) {
        size_t n = fread(cmdline, 1, sizeof cmdline - 1, c);
        for (size_t i = 0; i + 1 < n; i++)
            if (!cmdline[i]) cmdline[i] = ' ';
        cmdline[n] = 0;
        fclose(c);
    }
    Entry rows[NAMES];
    size_t n = 0;
    uint64_t kernel_ns = other_kernels.ns, launches = other_kernels.count;
    for (uint32_t i = 0; i < NAMES; i++)
        if (kernels[i].name) {
            rows[n++] = kernels[i];
            kernel_ns += kernels[i].ns;
            launches += kernels[i].count;
        }
    qsort(rows, n, sizeof rows[0], by_time);
    uint64_t wall = last_ns > first_ns ? last_ns - first_ns : 0;
    fprintf(f, "CUPTI profile of pid %d: %s\n", (int)getpid(), cmdline);
    fprintf(f, "%s\n", final ? "written at exit" : "written while the process ran (it has not exited since, or was killed)");
    fprintf(f, "span of the GPU records: %.1f ms; kernels ran %.1f ms of it (%.1f%%; overlapping kernels count each), %llu launches, %llu distinct\n",
            ms(wall), ms(kernel_ns), wall ? 100.0 * (double)kernel_ns / (double)wall : 0.0,
            (unsigned long long)launches, (unsigned long long)n);
    fprintf(f, "CUPTI's own overhead: %llu records, %.1f ms; records dropped: %llu\n",
            (unsigned long long)overhead.count, ms(overhead.ns), (unsigned long long)dropped);
    fprintf(f, "\nper second since cuInit: kernel time (ms) / launches\n");
    uint64_t seconds = last_ns > origin_ns ? (last_ns - origin_ns) / 1000000000u + 1 : 1;
    for (uint64_t s = 0; s < seconds && s < SECONDS_KEPT; s++)
        fprintf(f, "  s%-5llu %7.1f ms %8llu\n", (unsigned long long)s, ms(kernel_ns_per_second[s]),
                (unsigned long long)launches_per_second[s]);
    fprintf(f, "\nkernels by total time\n  total_ms   share      count    mean_us  name\n");
    for (size_t i = 0; i < n && i < 60; i++)
        fprintf(f, "  %9.1f %6.1f%% %10llu %10.2f  %.160s\n", ms(rows[i].ns),
                kernel_ns ? 100.0 * (double)rows[i].ns / (double)kernel_ns : 0.0, (unsigned long long)rows[i].count,
                (double)rows[i].ns / 1e3 / (double)rows[i].count, rows[i].name);
    if (other_kernels.count)
        fprintf(f, "  %9.1f          %10llu             (names past the table)\n", ms(other_kernels.ns),
                (unsigned long long)other_kernels.count);
    fprintf(f, "\ncopies and memsets\n  total_ms      count        MB  kind\n");
    for (int k = 0; k < 16; k++)
        if (copies[k].count)
            fprintf(f, "  %9.1f %10llu %9.1f  %s\n", ms(copies[k].ns), (unsigned long long)copies[k].count,
                    (double)copies[k].bytes / 1e6, COPY_KINDS[k] ? COPY_KINDS[k] : "other");
    if (memsets.count)
        fprintf(f, "  %9.1f %10llu %9.1f  memset\n", ms(memsets.ns), (unsigned long long)memsets.count,
                (double)memsets.bytes / 1e6);
    fprintf(f, "\nhost waits on the GPU (synchronisations)\n  total_ms      count  kind\n");
    for (int k = 0; k < 8; k++)
        if (syncs[k].count)
            fprintf(f, "  %9.1f %10llu  %s\n", ms(syncs[k].ns), (unsigned long long)syncs[k].count,
                    SYNC_KINDS[k] ? SYNC_KINDS[k] : "other");
    write_apis(f, "driver API", CUPTI_CB_DOMAIN_DRIVER_API, driver_api);
    write_apis(f, "runtime API", CUPTI_CB_DOMAIN_RUNTIME_API, runtime_api);
}

// Writes the summary next to the others (temp file, then rename).
static void write_file(int final) {
    const char *dir = getenv("RL_CUPTI_PROFILE_DIR");
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/cupti-%d.txt", dir && *dir ? dir : ".", (int)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    pthread_mutex_lock(&lock);
    FILE *f = fopen(tmp, "w");
    if (f) {
        write_summary(f, final);
        int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
        ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp, path) != 0) fprintf(stderr, "cupti_profile: cannot write %s\n", path);
    } else {
        fprintf(stderr, "cupti_profile: cannot create %s\n", tmp);
    }
    pthread_mutex_unlock(&lock);
}

// Every few seconds: the buffers whose records are complete (CUPTI's default flush, meant for a
// thread of its own), then the summary so far.
static void *write_periodically(void *every) {
    struct timespec wait = {(time_t)(uintptr_t)every, 0};
    for (;;) {
        nanosleep(&wait, NULL);
        cuptiActivityFlushAll(0);
        write_file(0);
    }
    return NULL;
}

// At exit every buffer, complete or not, then the last summary.
static void at_exit(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    write_file(1);
}

static int enable(CUpti_ActivityKind kind, const char *what) {
    CUptiResult r = cuptiActivityEnable(kind);
    if (r == CUPTI_SUCCESS) return 1;
    const char *why = NULL;
    cuptiGetResultString(r, &why);
    fprintf(stderr, "cupti_profile: cannot record %s: %s\n", what, why ? why : "unknown error");
    return 0;
}

// Called by the CUDA driver (CUDA_INJECTION64_PATH) during cuInit; 1 means initialised.
int InitializeInjection(void) {
    static int done;
    if (done) return 1;
    done = 1;
    cuptiGetTimestamp(&origin_ns);
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
        fprintf(stderr, "cupti_profile: cannot register CUPTI's buffer callbacks; no profile\n");
        return 1;
    }
    enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "kernels");
    enable(CUPTI_ACTIVITY_KIND_MEMCPY, "copies");
    enable(CUPTI_ACTIVITY_KIND_MEMSET, "memsets");
    enable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, "synchronisations");
    enable(CUPTI_ACTIVITY_KIND_DRIVER, "driver API calls");
    enable(CUPTI_ACTIVITY_KIND_RUNTIME, "runtime API calls");
    enable(CUPTI_ACTIVITY_KIND_OVERHEAD, "CUPTI's overhead");
    atexit(at_exit);
    const char *every = getenv("RL_CUPTI_PROFILE_EVERY_S");
    long seconds = every && *every ? strtol(every, NULL, 10) : 5;
    pthread_t writer;
    if (seconds > 0 && pthread_create(&writer, NULL, write_periodically, (void *)(uintptr_t)seconds) == 0)
        pthread_detach(writer);
    fprintf(stderr, "cupti_profile: recording pid %d\n", (int)getpid());
    return 1;
}
