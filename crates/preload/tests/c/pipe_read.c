/*
 * A thread blocked in read() of a pipe (a call a preload library does not
 * interpose) blocks only itself: while it waits, 4 worker threads finish
 * counted work that needs each other (a mutex, a condvar, sleeps, yields),
 * with an exact total. Then the pipe is written and the reader returns
 * the bytes. Phase 1 blocks one reader; phase 2 blocks 3 readers at once
 * (more than `ginza run --kthreads 2` has kthreads).
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#define WORKERS 4
#define ITEMS 2000
#define MAX_READERS 3

struct reader {
	int fd;
	atomic_int state; /* 1: about to read, 2: read returned */
	char got[32];
	ssize_t n;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_cv = PTHREAD_COND_INITIALIZER;
static long total;
static int turn;

static void *read_pipe(void *arg)
{
	struct reader *r = arg;
	atomic_store(&r->state, 1);
	r->n = read(r->fd, r->got, sizeof r->got - 1);
	atomic_store(&r->state, 2);
	return NULL;
}

/* Workers take turns in a fixed order, so none finishes without the
 * others running too. */
static void *work(void *arg)
{
	int id = (int)(uintptr_t)arg;
	for (int i = 0; i < ITEMS; i++) {
		pthread_mutex_lock(&lock);
		while (turn % WORKERS != id)
			pthread_cond_wait(&turn_cv, &lock);
		total += id + 1;
		turn++;
		pthread_cond_broadcast(&turn_cv);
		pthread_mutex_unlock(&lock);
		if (i % 200 == 0)
			usleep(100);
		else if (i % 50 == 0)
			sched_yield();
	}
	return NULL;
}

static void phase(int readers)
{
	int fds[MAX_READERS][2];
	struct reader r[MAX_READERS];
	pthread_t rt[MAX_READERS], wt[WORKERS];
	memset(r, 0, sizeof r);
	total = 0;
	turn = 0;
	for (int i = 0; i < readers; i++) {
		CHECK(pipe(fds[i]) == 0, "pipe: %s", strerror(errno));
		r[i].fd = fds[i][0];
		PT(pthread_create(&rt[i], NULL, read_pipe, &r[i]));
	}
	for (int i = 0; i < readers; i++)
		while (atomic_load(&r[i].state) == 0)
			sched_yield();
	usleep(10 * 1000); /* let the readers enter read() */

	uint64_t t0 = now_ns();
	for (int i = 0; i < WORKERS; i++)
		PT(pthread_create(&wt[i], NULL, work, (void *)(uintptr_t)i));
	for (int i = 0; i < WORKERS; i++)
		PT(pthread_join(wt[i], NULL));
	long want = (long)ITEMS * WORKERS * (WORKERS + 1) / 2;
	CHECK(total == want, "%d blocked readers: total %ld, expected %ld",
	      readers, total, want);
	for (int i = 0; i < readers; i++)
		CHECK(atomic_load(&r[i].state) == 1,
		      "reader %d returned (%zd) before anything was written", i,
		      r[i].n);
	fprintf(stderr, "%d blocked reader(s): workers done in %.1f ms\n",
		readers, (now_ns() - t0) / 1e6);

	for (int i = 0; i < readers; i++) {
		char msg[32];
		int len = snprintf(msg, sizeof msg, "hello %d", i);
		CHECK(write(fds[i][1], msg, (size_t)len) == len, "write: %s",
		      strerror(errno));
	}
	for (int i = 0; i < readers; i++) {
		PT(pthread_join(rt[i], NULL));
		char want_msg[32];
		snprintf(want_msg, sizeof want_msg, "hello %d", i);
		CHECK(r[i].n == (ssize_t)strlen(want_msg) &&
			      strcmp(r[i].got, want_msg) == 0,
		      "reader %d read %zd bytes \"%s\"", i, r[i].n, r[i].got);
		close(fds[i][0]);
		close(fds[i][1]);
	}
}

int main(void)
{
	phase(1);
	phase(MAX_READERS);
	PASS("pipe_read");
}
