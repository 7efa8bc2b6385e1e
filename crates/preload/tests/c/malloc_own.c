/*
 * The program brings its own malloc, as Redis brings jemalloc: pthread
 * mutexes inside (one per size class), and per-thread state in `__thread`
 * variables (reached through the thread pointer). Defined in the executable, it
 * serves every allocation of the process, the preload library's own
 * included. Each call checks that
 *
 *   - the thread pointer after taking the allocator's mutex is the one it
 *     entered with (an allocator keeps the address of its per-thread state
 *     in a register across its own lock, as jemalloc does: a call that
 *     comes back on another thread's pointer goes on with that other
 *     thread's state), and
 *   - no thread's state is entered while a call is already inside it (two
 *     kernel threads on one state at once, or a call that re-enters the
 *     allocator from inside its own lock).
 *
 * Meanwhile 4 threads allocate, fill, check and free; 2 create and join
 * threads (each new thread's TLS block comes from this malloc); 2 time
 * out on condvars and sleep (the library allocates per timed wait); all
 * for 1.5 s. A run that has not ended after 20 s fails (a deadlock). On
 * Linux every check holds trivially: that checks the test.
 */
#include "check.h"
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the allocator ------------------------------------------------------ */

#define HDR 16
#define CLASSES 13 /* 16 B .. 64 KiB */
#define MAGIC 0x6f776e6du
#define MAGIC_ALIGNED 0x616c6e64u
#define BIG 0xffffu
#define REGION (64u << 20)

struct hdr {
	uint32_t magic;
	uint32_t cls; /* size class, or BIG for a mapping of its own */
	uint64_t n;   /* BIG: the mapping's length; aligned: offset to base */
};

static pthread_mutex_t heap_locks[CLASSES] = {
	[0 ... CLASSES - 1] = PTHREAD_MUTEX_INITIALIZER};
/* Per class, under its lock: freed blocks, and the region new ones are
 * cut from. */
static void *free_list[CLASSES];
static char *bump[CLASSES], *bump_end[CLASSES];

/* What the checks found (read by main). */
static atomic_long calls, moved, overlapped;

/* This thread's state: whether a call is inside it. */
static __thread int inside;

static inline uintptr_t thread_pointer(void)
{
	uintptr_t tp;
	__asm__ __volatile__("mov %%fs:0, %0" : "=r"(tp));
	return tp;
}

static void die(const char *why)
{
	(void)!write(2, why, strlen(why));
	_exit(3);
}

static int class_of(size_t n)
{
	int c = 0;
	while (((size_t)16 << c) < n)
		c++;
	return c;
}

/* Takes class `c`'s lock with the check after it; `tp` is the thread
 * pointer at entry. */
static void lock_heap(uintptr_t tp, int c)
{
	pthread_mutex_lock(&heap_locks[c]);
	if (thread_pointer() != tp)
		atomic_fetch_add(&moved, 1);
}

static void enter(void)
{
	atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
	if (inside)
		atomic_fetch_add(&overlapped, 1);
	inside = 1;
}

static void leave(void)
{
	inside = 0;
}

static void *alloc(size_t n)
{
	if (n > ((size_t)16 << (CLASSES - 1))) {
		size_t len = (n + HDR + 4095) & ~(size_t)4095;
		struct hdr *h = mmap(0, len, PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (h == MAP_FAILED)
			return NULL;
		*h = (struct hdr){MAGIC, BIG, len};
		return (char *)h + HDR;
	}
	int c = class_of(n);
	size_t size = HDR + ((size_t)16 << c);
	uintptr_t tp = thread_pointer();
	lock_heap(tp, c);
	struct hdr *h = free_list[c];
	if (h) {
		free_list[c] = *(void **)((char *)h + HDR);
	} else {
		if (!bump[c] || bump[c] + size > bump_end[c]) {
			bump[c] = mmap(0, REGION, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
				       -1, 0);
			if (bump[c] == MAP_FAILED)
				die("FAIL malloc_own: out of memory\n");
			bump_end[c] = bump[c] + REGION;
		}
		h = (struct hdr *)bump[c];
		bump[c] += size;
	}
	pthread_mutex_unlock(&heap_locks[c]);
	*h = (struct hdr){MAGIC, (uint32_t)c, 0};
	return (char *)h + HDR;
}

static struct hdr *header(void *p)
{
	struct hdr *h = (struct hdr *)((char *)p - HDR);
	if (h->magic == MAGIC_ALIGNED)
		h = (struct hdr *)((char *)p - h->n - HDR);
	if (h->magic != MAGIC)
		die("FAIL malloc_own: free of a pointer it did not give\n");
	return h;
}

static size_t usable(void *p)
{
	struct hdr *h = header(p);
	size_t end = h->cls == BIG ? h->n : HDR + ((size_t)16 << h->cls);
	return (size_t)((char *)h + end - (char *)p);
}

static void release(void *p)
{
	struct hdr *h = header(p);
	if (h->cls == BIG) {
		munmap(h, h->n);
		return;
	}
	uintptr_t tp = thread_pointer();
	int c = h->cls;
	lock_heap(tp, c);
	*(void **)((char *)h + HDR) = free_list[c];
	free_list[c] = h;
	pthread_mutex_unlock(&heap_locks[c]);
}

static void *alloc_aligned(size_t align, size_t n)
{
	if (align <= HDR)
		return alloc(n);
	char *base = alloc(n + align + HDR);
	if (!base)
		return NULL;
	uintptr_t p = ((uintptr_t)base + HDR + align - 1) & ~(uintptr_t)(align - 1);
	struct hdr *h = (struct hdr *)(p - HDR);
	h->magic = MAGIC_ALIGNED;
	h->n = p - (uintptr_t)base;
	return (void *)p;
}

void *malloc(size_t n)
{
	enter();
	void *p = alloc(n);
	leave();
	return p;
}

void free(void *p)
{
	if (!p)
		return;
	enter();
	release(p);
	leave();
}

void *calloc(size_t k, size_t n)
{
	if (n && k > SIZE_MAX / n)
		return NULL;
	enter();
	void *p = alloc(k * n);
	leave();
	if (p)
		memset(p, 0, k * n);
	return p;
}

void *realloc(void *old, size_t n)
{
	if (!old)
		return malloc(n);
	enter();
	void *p = alloc(n);
	if (p) {
		size_t keep = usable(old);
		memcpy(p, old, keep < n ? keep : n);
		release(old);
	}
	leave();
	return p;
}

int posix_memalign(void **out, size_t align, size_t n)
{
	if (align < sizeof(void *) || (align & (align - 1)))
		return EINVAL;
	enter();
	void *p = alloc_aligned(align, n);
	leave();
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

void *aligned_alloc(size_t align, size_t n)
{
	enter();
	void *p = alloc_aligned(align, n);
	leave();
	return p;
}

void *memalign(size_t align, size_t n)
{
	return aligned_alloc(align, n);
}

void *valloc(size_t n)
{
	return aligned_alloc(4096, n);
}

void *pvalloc(size_t n)
{
	return aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
}

size_t malloc_usable_size(void *p)
{
	return p ? usable(p) : 0;
}

/* ---- the load ----------------------------------------------------------- */

#define CHURNERS 4
#define SPAWNERS 2
#define WAITERS 2
#define RUN_NS 1500000000ull
#define LIVE 32

static uint64_t stop_at;
static long churned[CHURNERS], spawned[SPAWNERS], timed_out[WAITERS];

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void *churn(void *arg)
{
	int id = (int)(intptr_t)arg;
	uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1);
	unsigned char *live[LIVE] = {0};
	size_t len[LIVE] = {0};
	while (now_ns() < stop_at) {
		int i = (int)(rng_next(&s) % LIVE);
		if (live[i]) {
			for (size_t k = 0; k < len[i]; k++)
				CHECK(live[i][k] == (unsigned char)(id * 7 + k),
				      "thread %d: byte %zu of a %zu-byte block "
				      "is %#x", id, k, len[i], live[i][k]);
			free(live[i]);
		}
		len[i] = 16 + rng_next(&s) % 2000;
		live[i] = malloc(len[i]);
		CHECK(live[i] != NULL, "malloc(%zu)", len[i]);
		for (size_t k = 0; k < len[i]; k++)
			live[i][k] = (unsigned char)(id * 7 + k);
		churned[id]++;
	}
	for (int i = 0; i < LIVE; i++)
		free(live[i]);
	return NULL;
}

static void *child(void *arg)
{
	char *p = malloc(64);
	CHECK(p != NULL, "malloc in a new thread");
	free(p);
	return arg;
}

static void *spawn(void *arg)
{
	int id = (int)(intptr_t)arg;
	while (now_ns() < stop_at) {
		pthread_t t;
		void *r;
		PT(pthread_create(&t, NULL, child, (void *)(intptr_t)(id + 5)));
		PT(pthread_join(t, &r));
		CHECK(r == (void *)(intptr_t)(id + 5), "joined value %p", r);
		spawned[id]++;
	}
	return NULL;
}

static void no_progress(int sig)
{
	(void)sig;
	die("FAIL malloc_own: not done after 20 s (a deadlock)\n");
}

static void *wait_a_little(void *arg)
{
	int id = (int)(intptr_t)arg;
	pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t c = PTHREAD_COND_INITIALIZER;
	PT(pthread_mutex_lock(&m));
	while (now_ns() < stop_at) {
		struct timespec at;
		clock_gettime(CLOCK_REALTIME, &at);
		at.tv_nsec += 50000;
		if (at.tv_nsec >= 1000000000) {
			at.tv_sec++;
			at.tv_nsec -= 1000000000;
		}
		CHECK_RC(pthread_cond_timedwait(&c, &m, &at), ETIMEDOUT);
		timed_out[id]++;
		struct timespec nap = {0, 20000};
		nanosleep(&nap, NULL);
	}
	PT(pthread_mutex_unlock(&m));
	return NULL;
}

int main(void)
{
	pthread_t t[CHURNERS + SPAWNERS + WAITERS];
	int n = 0;
	signal(SIGALRM, no_progress);
	alarm(20);
	stop_at = now_ns() + RUN_NS;
	for (int i = 0; i < CHURNERS; i++)
		PT(pthread_create(&t[n++], NULL, churn, (void *)(intptr_t)i));
	for (int i = 0; i < SPAWNERS; i++)
		PT(pthread_create(&t[n++], NULL, spawn, (void *)(intptr_t)i));
	for (int i = 0; i < WAITERS; i++)
		PT(pthread_create(&t[n++], NULL, wait_a_little,
				  (void *)(intptr_t)i));
	for (int i = 0; i < n; i++)
		PT(pthread_join(t[i], NULL));
	for (int i = 0; i < CHURNERS; i++)
		CHECK(churned[i] > 100, "churner %d did %ld rounds", i, churned[i]);
	for (int i = 0; i < SPAWNERS; i++)
		CHECK(spawned[i] > 0, "spawner %d made no thread", i);
	for (int i = 0; i < WAITERS; i++)
		CHECK(timed_out[i] > 0, "waiter %d never timed out", i);
	long c = atomic_load(&calls), m = atomic_load(&moved),
	     o = atomic_load(&overlapped);
	printf("malloc_own: %ld calls, %ld came back on another thread "
	       "pointer, %ld entered a state already in use\n", c, m, o);
	CHECK(m == 0, "%ld of %ld calls came back from the allocator's lock "
	      "on another thread pointer", m, c);
	CHECK(o == 0, "%ld of %ld calls entered a thread's allocator state "
	      "while a call was inside it", o, c);
	PASS("malloc_own");
}
