/*
 * What the C test programs share: checks that print where and why they
 * failed and exit 1, and a monotonic clock in nanoseconds.
 *
 * Every program exits 0 when all its checks hold. A failure message starts
 * with "FAIL" so the Rust harness (c_suite.rs) output is easy to scan.
 */
#ifndef GINZA_TEST_CHECK_H
#define GINZA_TEST_CHECK_H

#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Fails the program unless cond holds. */
#define CHECK(cond, ...)                                                     \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__,        \
				__LINE__, #cond);                            \
			fprintf(stderr, __VA_ARGS__);                        \
			fputc('\n', stderr);                                 \
			fflush(stdout);                                      \
			exit(1);                                             \
		}                                                            \
	} while (0)

/* Fails unless a pthread-style call (error number returned) gives `want`. */
#define CHECK_RC(call, want)                                                 \
	do {                                                                 \
		int rc_ = (call);                                            \
		CHECK(rc_ == (want), "%s returned %d (%s), expected %d (%s)", \
		      #call, rc_, strerror(rc_), (int)(want),                \
		      strerror(want));                                       \
	} while (0)

/* Fails unless a pthread-style call succeeds. */
#define PT(call) CHECK_RC(call, 0)

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Burns CPU for about `ns` without blocking (long enough to be preempted). */
static inline void spin_ns(uint64_t ns)
{
	uint64_t end = now_ns() + ns;
	while (now_ns() < end)
		__asm__ __volatile__("" ::: "memory");
}

/* Sorts n values and returns the median (the lower one for even n). */
static inline uint64_t median_u64(uint64_t *v, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
			uint64_t t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return v[(n - 1) / 2];
}

#define PASS(name)                                                           \
	do {                                                                 \
		printf("ok %s\n", name);                                     \
		return 0;                                                    \
	} while (0)

#endif
