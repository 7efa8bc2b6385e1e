/*
 * Blocking calls that start together each get a thread of the pool that
 * runs them (blocking.rs): none waits behind another that may never end.
 * Readers warm the pool up and leave pool threads idle; then
 * READERS threads block in read() of their own pipes at once. The pipes
 * are written one at a time, the last reader's first (the one a pool that
 * handed two of them to one idle thread would leave queued), and each
 * reader must return while the pipes after it are still empty.
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#define READERS 16
/* Pool threads left idle by the warm-up. */
#define WARM 2
/* How long a reader whose pipe was written may take to return. */
#define RETURN_NS (10ull * 1000 * 1000 * 1000)

struct reader {
	int fd;
	atomic_int done;
	char got[32];
	ssize_t n;
};

static pthread_barrier_t start;

static void *read_pipe(void *arg)
{
	struct reader *r = arg;
	pthread_barrier_wait(&start);
	r->n = read(r->fd, r->got, sizeof r->got - 1);
	atomic_store(&r->done, 1);
	return NULL;
}

static void warm_up(void)
{
	int p[WARM][2];
	struct reader r[WARM];
	pthread_t t[WARM];
	memset(r, 0, sizeof r);
	PT(pthread_barrier_init(&start, NULL, WARM));
	for (int i = 0; i < WARM; i++) {
		CHECK(pipe(p[i]) == 0, "pipe: %s", strerror(errno));
		r[i].fd = p[i][0];
		PT(pthread_create(&t[i], NULL, read_pipe, &r[i]));
	}
	for (int i = 0; i < WARM; i++) {
		CHECK(write(p[i][1], "w", 1) == 1, "write: %s", strerror(errno));
		PT(pthread_join(t[i], NULL));
		CHECK(r[i].n == 1, "warm-up read %d gave %zd", i, r[i].n);
		close(p[i][0]);
		close(p[i][1]);
	}
	PT(pthread_barrier_destroy(&start));
}

int main(void)
{
	warm_up();
	int fds[READERS][2];
	struct reader r[READERS];
	pthread_t t[READERS];
	memset(r, 0, sizeof r);
	PT(pthread_barrier_init(&start, NULL, READERS + 1));
	for (int i = 0; i < READERS; i++) {
		CHECK(pipe(fds[i]) == 0, "pipe: %s", strerror(errno));
		r[i].fd = fds[i][0];
		PT(pthread_create(&t[i], NULL, read_pipe, &r[i]));
	}
	pthread_barrier_wait(&start);
	/* Both CPUs busy while the readers start (this thread spins): a pool
	 * thread woken for one of them is slow to run, as on a loaded machine. */
	spin_ns(5 * 1000 * 1000);
	for (int i = READERS - 1; i >= 0; i--) {
		char msg[32];
		int len = snprintf(msg, sizeof msg, "hello %d", i);
		CHECK(write(fds[i][1], msg, (size_t)len) == len, "write: %s", strerror(errno));
		uint64_t give_up = now_ns() + RETURN_NS;
		while (!atomic_load(&r[i].done)) {
			CHECK(now_ns() < give_up,
			      "reader %d did not return within 10 s of its pipe being written "
			      "(its read waits behind the readers of pipes still empty)",
			      i);
			sched_yield();
		}
		CHECK(r[i].n == len && memcmp(r[i].got, msg, (size_t)len) == 0,
		      "reader %d read %zd bytes", i, r[i].n);
	}
	for (int i = 0; i < READERS; i++) {
		PT(pthread_join(t[i], NULL));
		close(fds[i][0]);
		close(fds[i][1]);
	}
	PASS("pipe_burst");
}
