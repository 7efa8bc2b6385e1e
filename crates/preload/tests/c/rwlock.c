/*
 * Readers and writers on one rwlock: readers never see a writer inside nor
 * a half-done update (two fields written apart), writers are alone, and
 * the writers' total is exact. Also: tryrdlock/trywrlock EBUSY while a
 * writer holds it, trywrlock EBUSY while readers hold it, several readers
 * at once, a static initializer and timed locks.
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>

#define READERS 6
#define WRITERS 3
#define WRITES 20000
#define READS 40000

static pthread_rwlock_t rw = PTHREAD_RWLOCK_INITIALIZER;
static pthread_rwlock_t rw2;
static volatile long a, b; /* a writer keeps a == b */
static atomic_int readers_in, writers_in, max_readers;

static void *reader(void *arg)
{
	(void)arg;
	for (int i = 0; i < READS; i++) {
		pthread_rwlock_rdlock(&rw);
		int r = atomic_fetch_add(&readers_in, 1) + 1;
		int m = atomic_load(&max_readers);
		while (r > m && !atomic_compare_exchange_weak(&max_readers, &m, r))
			;
		CHECK(atomic_load(&writers_in) == 0, "a reader with a writer in");
		long x = a;
		if (i % 512 == 0)
			sched_yield();
		long y = b;
		CHECK(x == y, "a reader saw a half-done write (%ld, %ld)", x, y);
		atomic_fetch_sub(&readers_in, 1);
		pthread_rwlock_unlock(&rw);
	}
	return NULL;
}

static void *writer(void *arg)
{
	(void)arg;
	for (int i = 0; i < WRITES; i++) {
		pthread_rwlock_wrlock(&rw);
		CHECK(atomic_fetch_add(&writers_in, 1) == 0, "two writers in");
		CHECK(atomic_load(&readers_in) == 0, "a writer with readers in");
		a = a + 1;
		if (i % 256 == 0)
			sched_yield();
		b = b + 1;
		atomic_fetch_sub(&writers_in, 1);
		pthread_rwlock_unlock(&rw);
	}
	return NULL;
}

static atomic_int both_in;
static pthread_barrier_t two;

/* Two readers hold rw2 at the same time: each waits at a barrier inside. */
static void *shared_reader(void *arg)
{
	(void)arg;
	PT(pthread_rwlock_rdlock(&rw2));
	atomic_fetch_add(&both_in, 1);
	pthread_barrier_wait(&two);
	PT(pthread_rwlock_unlock(&rw2));
	return NULL;
}

static void *try_locks(void *arg)
{
	int *rcs = arg;
	rcs[0] = pthread_rwlock_tryrdlock(&rw2);
	if (rcs[0] == 0)
		pthread_rwlock_unlock(&rw2);
	rcs[1] = pthread_rwlock_trywrlock(&rw2);
	if (rcs[1] == 0)
		pthread_rwlock_unlock(&rw2);
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_nsec += 10 * 1000 * 1000;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	rcs[2] = pthread_rwlock_timedwrlock(&rw2, &dl);
	if (rcs[2] == 0)
		pthread_rwlock_unlock(&rw2);
	return NULL;
}

static void probe(int want_rd, int want_wr, const char *state)
{
	int rcs[3] = {-1, -1, -1};
	pthread_t t;
	PT(pthread_create(&t, NULL, try_locks, rcs));
	PT(pthread_join(t, NULL));
	CHECK(rcs[0] == want_rd, "%s: tryrdlock %d, expected %d", state,
	      rcs[0], want_rd);
	CHECK(rcs[1] == want_wr, "%s: trywrlock %d, expected %d", state,
	      rcs[1], want_wr);
	CHECK(rcs[2] == (want_wr ? ETIMEDOUT : 0),
	      "%s: timedwrlock %d, expected %d", state, rcs[2],
	      want_wr ? ETIMEDOUT : 0);
}

int main(void)
{
	pthread_t r[READERS], w[WRITERS];
	for (int i = 0; i < READERS; i++)
		PT(pthread_create(&r[i], NULL, reader, NULL));
	for (int i = 0; i < WRITERS; i++)
		PT(pthread_create(&w[i], NULL, writer, NULL));
	for (int i = 0; i < READERS; i++)
		PT(pthread_join(r[i], NULL));
	for (int i = 0; i < WRITERS; i++)
		PT(pthread_join(w[i], NULL));
	CHECK(a == (long)WRITERS * WRITES && b == a,
	      "writers' total a=%ld b=%ld, expected %ld", a, b,
	      (long)WRITERS * WRITES);
	fprintf(stderr, "at most %d readers at once\n",
		atomic_load(&max_readers));

	PT(pthread_rwlock_init(&rw2, NULL));
	PT(pthread_rwlock_wrlock(&rw2));
	probe(EBUSY, EBUSY, "write-locked");
	PT(pthread_rwlock_unlock(&rw2));
	PT(pthread_rwlock_rdlock(&rw2));
	probe(0, EBUSY, "read-locked");
	PT(pthread_rwlock_unlock(&rw2));
	probe(0, 0, "unlocked");

	PT(pthread_barrier_init(&two, NULL, 2));
	pthread_t s[2];
	for (int i = 0; i < 2; i++)
		PT(pthread_create(&s[i], NULL, shared_reader, NULL));
	for (int i = 0; i < 2; i++)
		PT(pthread_join(s[i], NULL));
	CHECK(atomic_load(&both_in) == 2, "readers in: %d",
	      atomic_load(&both_in));
	PT(pthread_barrier_destroy(&two));
	PT(pthread_rwlock_destroy(&rw2));
	PASS("rwlock");
}
