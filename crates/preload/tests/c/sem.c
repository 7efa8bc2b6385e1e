/*
 * POSIX unnamed semaphores: sem_init's value, sem_getvalue, sem_trywait
 * EAGAIN on zero, sem_timedwait ETIMEDOUT after its deadline (not before),
 * and 4 posters / 4 waiters passing exactly 40,000 units, with a
 * semaphore of value 3 letting at most 3 threads in at once.
 */
#include "check.h"
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>

#define POSTERS 4
#define WAITERS 4
#define UNITS 10000 /* per poster */

static sem_t items, slots3;
static atomic_long taken;
static atomic_int inside, max_inside;

static void *poster(void *arg)
{
	(void)arg;
	for (int i = 0; i < UNITS; i++)
		CHECK(sem_post(&items) == 0, "sem_post: %s", strerror(errno));
	return NULL;
}

static void *waiter(void *arg)
{
	(void)arg;
	for (int i = 0; i < UNITS; i++) {
		while (sem_wait(&items) != 0)
			CHECK(errno == EINTR, "sem_wait: %s", strerror(errno));
		atomic_fetch_add(&taken, 1);
		if (i % 100 == 0) {
			CHECK(sem_wait(&slots3) == 0, "sem_wait: %s",
			      strerror(errno));
			int n = atomic_fetch_add(&inside, 1) + 1;
			int m = atomic_load(&max_inside);
			while (n > m &&
			       !atomic_compare_exchange_weak(&max_inside, &m, n))
				;
			sched_yield();
			atomic_fetch_sub(&inside, 1);
			CHECK(sem_post(&slots3) == 0, "sem_post");
		}
	}
	return NULL;
}

int main(void)
{
	sem_t s;
	int v = -1;
	CHECK(sem_init(&s, 0, 2) == 0, "sem_init: %s", strerror(errno));
	CHECK(sem_getvalue(&s, &v) == 0 && v == 2, "getvalue %d, expected 2", v);
	CHECK(sem_trywait(&s) == 0, "trywait at 2: %s", strerror(errno));
	CHECK(sem_wait(&s) == 0, "wait at 1: %s", strerror(errno));
	errno = 0;
	CHECK(sem_trywait(&s) == -1 && errno == EAGAIN,
	      "trywait at 0 gave errno %d (%s), expected EAGAIN", errno,
	      strerror(errno));
	CHECK(sem_getvalue(&s, &v) == 0 && v == 0, "getvalue %d, expected 0", v);

	for (int i = 0; i < 3; i++) {
		struct timespec dl;
		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_nsec += 20 * 1000 * 1000;
		if (dl.tv_nsec >= 1000000000L) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000L;
		}
		uint64_t t0 = now_ns();
		errno = 0;
		int rc = sem_timedwait(&s, &dl);
		uint64_t took = now_ns() - t0;
		CHECK(rc == -1 && errno == ETIMEDOUT,
		      "timedwait at 0: rc %d errno %d (%s)", rc, errno,
		      strerror(errno));
		CHECK(took >= 19 * 1000 * 1000 && took < 200 * 1000 * 1000,
		      "a 20 ms sem_timedwait took %.3f ms", took / 1e6);
	}
	CHECK(sem_post(&s) == 0, "post");
	CHECK(sem_getvalue(&s, &v) == 0 && v == 1, "getvalue %d, expected 1", v);
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 5;
	CHECK(sem_timedwait(&s, &dl) == 0, "timedwait at 1: %s",
	      strerror(errno));
	CHECK(sem_destroy(&s) == 0, "destroy");

	CHECK(sem_init(&items, 0, 0) == 0, "sem_init");
	CHECK(sem_init(&slots3, 0, 3) == 0, "sem_init");
	pthread_t p[POSTERS], w[WAITERS];
	for (int i = 0; i < WAITERS; i++)
		PT(pthread_create(&w[i], NULL, waiter, NULL));
	for (int i = 0; i < POSTERS; i++)
		PT(pthread_create(&p[i], NULL, poster, NULL));
	for (int i = 0; i < POSTERS; i++)
		PT(pthread_join(p[i], NULL));
	for (int i = 0; i < WAITERS; i++)
		PT(pthread_join(w[i], NULL));
	CHECK(atomic_load(&taken) == (long)WAITERS * UNITS,
	      "%ld units taken, expected %ld", atomic_load(&taken),
	      (long)WAITERS * UNITS);
	CHECK(sem_getvalue(&items, &v) == 0 && v == 0, "%d units left", v);
	CHECK(atomic_load(&max_inside) <= 3, "%d threads inside a value-3 "
	      "semaphore", atomic_load(&max_inside));
	CHECK(sem_getvalue(&slots3, &v) == 0 && v == 3, "slots3 at %d", v);
	sem_destroy(&items);
	sem_destroy(&slots3);
	PASS("sem");
}
