/*
 * The three mutex kinds and their error returns, static initializers and
 * pthread_mutexattr_settype both: normal (trylock EBUSY, a blocked lock
 * waits for the unlock), recursive (nesting; another thread's trylock
 * EBUSY and unlock EPERM until the last unlock), errorcheck (EDEADLK on a
 * relock by the owner, EPERM on unlock by a non-owner or when unlocked).
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

static pthread_mutex_t s_normal = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t s_recursive = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static pthread_mutex_t s_errorcheck = PTHREAD_ERRORCHECK_MUTEX_INITIALIZER_NP;

enum op { TRYLOCK, UNLOCK, LOCK_WAIT };

struct job {
	pthread_mutex_t *m;
	enum op op;
	int rc;
	atomic_int stage; /* LOCK_WAIT: 1 = about to lock, 2 = got it */
};

static void *other(void *arg)
{
	struct job *j = arg;
	switch (j->op) {
	case TRYLOCK:
		j->rc = pthread_mutex_trylock(j->m);
		if (j->rc == 0)
			pthread_mutex_unlock(j->m);
		break;
	case UNLOCK:
		j->rc = pthread_mutex_unlock(j->m);
		break;
	case LOCK_WAIT:
		atomic_store(&j->stage, 1);
		j->rc = pthread_mutex_lock(j->m);
		atomic_store(&j->stage, 2);
		if (j->rc == 0)
			pthread_mutex_unlock(j->m);
		break;
	}
	return NULL;
}

/* The result of `op` on m, done by a new thread. */
static int from_other(pthread_mutex_t *m, enum op op)
{
	struct job j = {.m = m, .op = op, .rc = -1};
	pthread_t t;
	PT(pthread_create(&t, NULL, other, &j));
	PT(pthread_join(t, NULL));
	return j.rc;
}

static void normal(pthread_mutex_t *m, const char *what)
{
	fprintf(stderr, "normal mutex (%s)\n", what);
	PT(pthread_mutex_lock(m));
	CHECK_RC(pthread_mutex_trylock(m), EBUSY);
	CHECK_RC(from_other(m, TRYLOCK), EBUSY);

	/* Another thread blocks in lock until this one unlocks. */
	struct job j = {.m = m, .op = LOCK_WAIT, .rc = -1};
	pthread_t t;
	PT(pthread_create(&t, NULL, other, &j));
	while (atomic_load(&j.stage) < 1)
		sched_yield();
	usleep(20 * 1000);
	CHECK(atomic_load(&j.stage) == 1,
	      "another thread locked a held mutex (stage %d)",
	      atomic_load(&j.stage));
	PT(pthread_mutex_unlock(m));
	PT(pthread_join(t, NULL));
	CHECK(j.rc == 0 && atomic_load(&j.stage) == 2,
	      "the waiter's lock returned %d", j.rc);

	PT(pthread_mutex_trylock(m));
	PT(pthread_mutex_unlock(m));
	CHECK_RC(from_other(m, TRYLOCK), 0);
}

static void recursive(pthread_mutex_t *m, const char *what)
{
	fprintf(stderr, "recursive mutex (%s)\n", what);
	PT(pthread_mutex_lock(m));
	PT(pthread_mutex_lock(m));
	PT(pthread_mutex_lock(m));
	PT(pthread_mutex_trylock(m)); /* held 4 times */
	CHECK_RC(from_other(m, TRYLOCK), EBUSY);
	CHECK_RC(from_other(m, UNLOCK), EPERM);
	for (int i = 0; i < 3; i++) {
		PT(pthread_mutex_unlock(m));
		CHECK_RC(from_other(m, TRYLOCK), EBUSY);
	}
	PT(pthread_mutex_unlock(m));
	CHECK_RC(from_other(m, TRYLOCK), 0);
	CHECK_RC(pthread_mutex_unlock(m), EPERM);
}

static void errorcheck(pthread_mutex_t *m, const char *what)
{
	fprintf(stderr, "errorcheck mutex (%s)\n", what);
	PT(pthread_mutex_lock(m));
	CHECK_RC(pthread_mutex_lock(m), EDEADLK);
	CHECK_RC(pthread_mutex_trylock(m), EBUSY);
	CHECK_RC(from_other(m, UNLOCK), EPERM);
	CHECK_RC(from_other(m, TRYLOCK), EBUSY);
	PT(pthread_mutex_unlock(m));
	CHECK_RC(pthread_mutex_unlock(m), EPERM);
	CHECK_RC(from_other(m, TRYLOCK), 0);
	PT(pthread_mutex_trylock(m));
	PT(pthread_mutex_unlock(m));
}

static void init_kind(pthread_mutex_t *m, int kind)
{
	pthread_mutexattr_t a;
	int got = -1;
	PT(pthread_mutexattr_init(&a));
	PT(pthread_mutexattr_settype(&a, kind));
	PT(pthread_mutexattr_gettype(&a, &got));
	CHECK(got == kind, "gettype %d after settype %d", got, kind);
	PT(pthread_mutex_init(m, &a));
	PT(pthread_mutexattr_destroy(&a));
}

int main(void)
{
	pthread_mutex_t m;

	normal(&s_normal, "PTHREAD_MUTEX_INITIALIZER");
	PT(pthread_mutex_init(&m, NULL));
	normal(&m, "init with NULL attributes");
	PT(pthread_mutex_destroy(&m));
	init_kind(&m, PTHREAD_MUTEX_NORMAL);
	normal(&m, "PTHREAD_MUTEX_NORMAL");
	PT(pthread_mutex_destroy(&m));

	recursive(&s_recursive, "PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP");
	init_kind(&m, PTHREAD_MUTEX_RECURSIVE);
	recursive(&m, "PTHREAD_MUTEX_RECURSIVE");
	PT(pthread_mutex_destroy(&m));

	errorcheck(&s_errorcheck, "PTHREAD_ERRORCHECK_MUTEX_INITIALIZER_NP");
	init_kind(&m, PTHREAD_MUTEX_ERRORCHECK);
	errorcheck(&m, "PTHREAD_MUTEX_ERRORCHECK");
	PT(pthread_mutex_destroy(&m));
	PASS("mutex_kinds");
}
