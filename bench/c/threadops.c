/*
 * threadops.c: the C peer of `ginza bench threadops`, measuring glibc
 * pthreads when run alone and Ginza's preload library when run under
 * `ginza run` (the same binary, unmodified).
 *
 * The operations are defined exactly as for the other systems of the
 * bench (crates/bench/src/threadops/mod.rs, bench/peers/threadops.go):
 *
 *   spawn_join        pthread_create of a thread returning a value, then
 *                     pthread_join; one op = one create + join
 *   yield_pingpong    two threads alternate on a shared turn variable,
 *                     calling sched_yield while it is not their turn;
 *                     one op = one hand-off (a round trip is 2 ops)
 *   condvar_pingpong  the same hand-off through a pthread mutex + condvar;
 *                     one op = one hand-off
 *   mutex             uncontended pthread_mutex_lock, increment, unlock
 *
 * Each operation runs one discarded warm-up sample, then -samples samples
 * of -iters operations timed with CLOCK_MONOTONIC; the median ns/op is
 * printed, all four as one JSON line on stdout in the Go peer's shape:
 *
 *   {"spawn_join":N,"yield_pingpong":N,"condvar_pingpong":N,"mutex":N}
 *
 * The caller chooses the CPUs (the bench sets the affinity mask before
 * exec); this program pins nothing itself.
 *
 * Build: cc -O2 -g -Wall -Werror -pthread -o threadops bench/c/threadops.c
 * Usage: threadops [-iters N] [-samples N]   (defaults 10000 and 5)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, int err)
{
	fprintf(stderr, "threadops: %s: %s\n", what, strerror(err));
	exit(1);
}

#define PT(call)                                                             \
	do {                                                                 \
		int rc_ = (call);                                            \
		if (rc_ != 0)                                                \
			die(#call, rc_);                                     \
	} while (0)

/* Keeps results alive so the compiler cannot drop the work. */
static volatile uint64_t sink;

/* One sample: nanoseconds taken and operations done. */
struct sample {
	uint64_t ns;
	uint64_t ops;
};

static void *return_arg(void *arg)
{
	return arg;
}

static struct sample spawn_join(uint64_t n)
{
	uint64_t t0 = now_ns();
	for (uint64_t i = 0; i < n; i++) {
		pthread_t t;
		void *ret;
		PT(pthread_create(&t, NULL, return_arg, (void *)(uintptr_t)i));
		PT(pthread_join(t, &ret));
		sink += (uintptr_t)ret;
	}
	return (struct sample){now_ns() - t0, n};
}

/* The partner of a ping-pong: started, then waited for until it runs, so
 * the timed part holds hand-offs only. */
struct pingpong {
	uint64_t rounds;
	atomic_int ready;
	atomic_int turn; /* yield: 1 = the partner's turn */
	pthread_mutex_t m;
	pthread_cond_t cv;
	int cv_turn; /* condvar: 1 = the partner's turn, under m */
};

static void start_partner(pthread_t *t, void *(*body)(void *),
			  struct pingpong *pp)
{
	PT(pthread_create(t, NULL, body, pp));
	while (!atomic_load_explicit(&pp->ready, memory_order_acquire))
		sched_yield();
}

static void *yield_partner(void *arg)
{
	struct pingpong *pp = arg;
	atomic_store_explicit(&pp->ready, 1, memory_order_release);
	for (uint64_t i = 0; i < pp->rounds; i++) {
		while (atomic_load_explicit(&pp->turn, memory_order_acquire) != 1)
			sched_yield();
		atomic_store_explicit(&pp->turn, 0, memory_order_release);
	}
	return NULL;
}

static struct sample yield_pingpong(uint64_t n)
{
	struct pingpong pp = {.rounds = (n + 1) / 2};
	pthread_t t;
	start_partner(&t, yield_partner, &pp);
	uint64_t t0 = now_ns();
	for (uint64_t i = 0; i < pp.rounds; i++) {
		atomic_store_explicit(&pp.turn, 1, memory_order_release);
		while (atomic_load_explicit(&pp.turn, memory_order_acquire) != 0)
			sched_yield();
	}
	uint64_t ns = now_ns() - t0;
	PT(pthread_join(t, NULL));
	return (struct sample){ns, 2 * pp.rounds};
}

static void *condvar_partner(void *arg)
{
	struct pingpong *pp = arg;
	atomic_store_explicit(&pp->ready, 1, memory_order_release);
	for (uint64_t i = 0; i < pp->rounds; i++) {
		pthread_mutex_lock(&pp->m);
		while (pp->cv_turn != 1)
			pthread_cond_wait(&pp->cv, &pp->m);
		pp->cv_turn = 0;
		pthread_cond_signal(&pp->cv);
		pthread_mutex_unlock(&pp->m);
	}
	return NULL;
}

static struct sample condvar_pingpong(uint64_t n)
{
	struct pingpong pp = {.rounds = (n + 1) / 2};
	PT(pthread_mutex_init(&pp.m, NULL));
	PT(pthread_cond_init(&pp.cv, NULL));
	pthread_t t;
	start_partner(&t, condvar_partner, &pp);
	uint64_t t0 = now_ns();
	for (uint64_t i = 0; i < pp.rounds; i++) {
		pthread_mutex_lock(&pp.m);
		pp.cv_turn = 1;
		pthread_cond_signal(&pp.cv);
		while (pp.cv_turn != 0)
			pthread_cond_wait(&pp.cv, &pp.m);
		pthread_mutex_unlock(&pp.m);
	}
	uint64_t ns = now_ns() - t0;
	PT(pthread_join(t, NULL));
	PT(pthread_cond_destroy(&pp.cv));
	PT(pthread_mutex_destroy(&pp.m));
	return (struct sample){ns, 2 * pp.rounds};
}

static struct sample mutex(uint64_t n)
{
	pthread_mutex_t m;
	uint64_t v = 0;
	PT(pthread_mutex_init(&m, NULL));
	uint64_t t0 = now_ns();
	for (uint64_t i = 0; i < n; i++) {
		pthread_mutex_lock(&m);
		v++;
		__asm__ __volatile__("" : "+r"(v)::"memory");
		pthread_mutex_unlock(&m);
	}
	uint64_t ns = now_ns() - t0;
	sink += v;
	PT(pthread_mutex_destroy(&m));
	return (struct sample){ns, n};
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median ns/op over `samples` samples, after one discarded warm-up. */
static double median_ns(struct sample (*op)(uint64_t), uint64_t iters,
			int samples)
{
	double *per = malloc(sizeof *per * (size_t)samples);
	if (!per)
		die("malloc", ENOMEM);
	op(iters);
	for (int s = 0; s < samples; s++) {
		struct sample r = op(iters);
		per[s] = (double)r.ns / (double)r.ops;
	}
	qsort(per, (size_t)samples, sizeof *per, cmp_double);
	int m = samples / 2;
	double med = samples % 2 ? per[m] : (per[m - 1] + per[m]) / 2;
	free(per);
	return med;
}

/* Parses a positive integer flag value, or exits with usage. */
static long positive(const char *flag, const char *value)
{
	char *end;
	errno = 0;
	long v = value ? strtol(value, &end, 10) : 0;
	if (!value || errno || *end || v < 1) {
		fprintf(stderr,
			"threadops: %s needs a positive integer\n"
			"usage: threadops [-iters N] [-samples N]\n",
			flag);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	uint64_t iters = 10000;
	int samples = 5;
	for (int i = 1; i < argc; i++) {
		/* -flag and --flag, as Go's flag package takes them. */
		const char *a = argv[i][0] == '-' && argv[i][1] == '-' ? argv[i] + 1
								     : argv[i];
		const char *value = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "-iters") == 0) {
			iters = (uint64_t)positive(a, value);
			i++;
		} else if (strcmp(a, "-samples") == 0) {
			samples = (int)positive(a, value);
			i++;
		} else {
			fprintf(stderr,
				"threadops: unknown argument %s\n"
				"usage: threadops [-iters N] [-samples N]\n",
				argv[i]);
			return 2;
		}
	}
	double spawn = median_ns(spawn_join, iters, samples);
	double yield = median_ns(yield_pingpong, iters, samples);
	double condvar = median_ns(condvar_pingpong, iters, samples);
	double mtx = median_ns(mutex, iters, samples);
	printf("{\"spawn_join\":%.1f,\"yield_pingpong\":%.1f,"
	       "\"condvar_pingpong\":%.1f,\"mutex\":%.1f}\n",
	       spawn, yield, condvar, mtx);
	return 0;
}
