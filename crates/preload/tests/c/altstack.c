/*
 * Each thread's alternate signal stack is its own (`sigaltstack`).
 *
 * 8 threads (run by 2 kthreads under Ginza) start with none (SS_DISABLE),
 * each sets a stack of its own, all meet, and each reads back its own
 * stack 20 times around `sched_yield`, never another thread's. Linux's
 * refusals change nothing: ENOMEM for a stack smaller than MINSIGSTKSZ,
 * EINVAL for an unknown mode. Disabling hands back the stack it replaces
 * and leaves SS_DISABLE.
 */
#include "check.h"
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#define THREADS 8
#define ROUNDS 20

static pthread_barrier_t set_all, done_all;

static void *body(void *arg)
{
	long id = (long)arg;
	stack_t got;
	CHECK(sigaltstack(NULL, &got) == 0, "%s", strerror(errno));
	CHECK(got.ss_flags & SS_DISABLE,
	      "thread %ld starts with flags %d, not SS_DISABLE", id,
	      got.ss_flags);

	/* Sizes differ per thread, so a stack read back names its owner. */
	size_t size = 4 * SIGSTKSZ + (size_t)id * 4096;
	void *mem = malloc(size);
	CHECK(mem != NULL, "malloc");
	stack_t mine = { .ss_sp = mem, .ss_size = size, .ss_flags = 0 };
	CHECK(sigaltstack(&mine, NULL) == 0, "%s", strerror(errno));
	pthread_barrier_wait(&set_all);
	for (int r = 0; r < ROUNDS; r++) {
		sched_yield();
		memset(&got, 0, sizeof got);
		CHECK(sigaltstack(NULL, &got) == 0, "%s", strerror(errno));
		CHECK(got.ss_sp == mem && got.ss_size == size &&
			      got.ss_flags == 0,
		      "thread %ld, round %d: read back %p, %zu bytes, flags %d; "
		      "it set %p, %zu bytes",
		      id, r, got.ss_sp, got.ss_size, got.ss_flags, mem, size);
	}

	stack_t small = { .ss_sp = mem, .ss_size = 16, .ss_flags = 0 };
	errno = 0;
	CHECK(sigaltstack(&small, NULL) == -1 && errno == ENOMEM,
	      "a 16-byte stack: errno %d (%s)", errno, strerror(errno));
	stack_t unknown = { .ss_sp = mem, .ss_size = size, .ss_flags = 0x1234 };
	errno = 0;
	CHECK(sigaltstack(&unknown, NULL) == -1 && errno == EINVAL,
	      "mode 0x1234: errno %d (%s)", errno, strerror(errno));
	CHECK(sigaltstack(NULL, &got) == 0 && got.ss_sp == mem &&
		      got.ss_size == size,
	      "a refused call changed the stack to %p, %zu bytes", got.ss_sp,
	      got.ss_size);

	stack_t off = { .ss_flags = SS_DISABLE }, before;
	CHECK(sigaltstack(&off, &before) == 0, "%s", strerror(errno));
	CHECK(before.ss_sp == mem && before.ss_size == size,
	      "disabling handed back %p, %zu bytes", before.ss_sp,
	      before.ss_size);
	CHECK(sigaltstack(NULL, &got) == 0 && (got.ss_flags & SS_DISABLE),
	      "flags %d after SS_DISABLE", got.ss_flags);
	pthread_barrier_wait(&done_all);
	free(mem);
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	PT(pthread_barrier_init(&set_all, NULL, THREADS));
	PT(pthread_barrier_init(&done_all, NULL, THREADS));
	for (long i = 0; i < THREADS; i++)
		PT(pthread_create(&t[i], NULL, body, (void *)i));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_join(t[i], NULL));
	printf("ok altstack\n");
	return 0;
}
