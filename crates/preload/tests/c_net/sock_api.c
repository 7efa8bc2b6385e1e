/*
 * The socket calls a program makes around its data, against a Linux TCP
 * echo server at HOST:PORT and a Linux UDP echo server at HOST:UDP_PORT:
 * names, FIONREAD and MSG_PEEK, vectors and messages, O_NONBLOCK three
 * ways, dup/dup2/F_DUPFD, poll, select and epoll over a pipe and a socket
 * together (waking on either), EPOLLONESHOT, options with Linux's answers,
 * shutdown and EPIPE with and without SIGPIPE, a loopback socket left to
 * the kernel, an epoll member's number reused while a dup of it lives,
 * and UDP.
 *
 *     sock_api HOST PORT UDP_PORT
 */
#include "net.h"

#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/uio.h>

static struct sockaddr_in addr_of(const char *host, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	CHECK(inet_pton(AF_INET, host, &a.sin_addr) == 1, "bad HOST %s", host);
	return a;
}

/* Reads exactly n bytes (blocking socket). */
static void read_exact(int fd, char *buf, size_t n)
{
	size_t at = 0;
	while (at < n) {
		ssize_t r = read(fd, buf + at, n - at);
		CHECK(r > 0, "read %zu of %zu: %zd %s", at, n, r, strerror(errno));
		at += (size_t)r;
	}
}

static void echo_check(int fd, const char *what)
{
	char back[64];
	size_t n = strlen(what);
	CHECK(write(fd, what, n) == (ssize_t)n, "write %s: %s", what, strerror(errno));
	read_exact(fd, back, n);
	CHECK(!memcmp(back, what, n), "echo of %s", what);
}

struct later {
	int fd;
	int delay_ms;
	const char *bytes;
};

/* Writes `bytes` to `fd` after `delay_ms` (a thread of its own). */
static void *write_later(void *arg)
{
	struct later *l = arg;
	usleep((useconds_t)l->delay_ms * 1000);
	CHECK(write(l->fd, l->bytes, strlen(l->bytes)) == (ssize_t)strlen(l->bytes), "late write: %s",
	      strerror(errno));
	return NULL;
}

static pthread_t start_later(struct later *l)
{
	pthread_t t;
	PT(pthread_create(&t, NULL, write_later, l));
	return t;
}

static int sigpipes;
static void on_sigpipe(int sig)
{
	(void)sig;
	sigpipes++;
}

static void names_and_peeking(int s, struct sockaddr_in to)
{
	struct sockaddr_in me, peer;
	socklen_t len = sizeof me;
	CHECK(getsockname(s, (struct sockaddr *)&me, &len) == 0 && len == sizeof me, "getsockname");
	CHECK(me.sin_family == AF_INET && me.sin_port != 0 && me.sin_addr.s_addr != 0,
	      "getsockname gave port %d", ntohs(me.sin_port));
	len = sizeof peer;
	CHECK(getpeername(s, (struct sockaddr *)&peer, &len) == 0, "getpeername: %s",
	      strerror(errno));
	CHECK(peer.sin_port == to.sin_port && peer.sin_addr.s_addr == to.sin_addr.s_addr,
	      "getpeername");
	/* A short buffer gets the address cut and the full length. */
	char tiny[4];
	len = sizeof tiny;
	CHECK(getpeername(s, (struct sockaddr *)tiny, &len) == 0 && len == sizeof peer,
	      "getpeername into 4 bytes gave len %u", len);

	CHECK(write(s, "hello", 5) == 5, "write: %s", strerror(errno));
	int avail = 0;
	uint64_t end = now_ns() + 5000000000ull;
	while (avail < 5 && now_ns() < end) {
		struct pollfd p = { .fd = s, .events = POLLIN };
		CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLIN), "poll for the echo");
		CHECK(ioctl(s, FIONREAD, &avail) == 0, "FIONREAD: %s", strerror(errno));
	}
	CHECK(avail == 5, "FIONREAD says %d", avail);
	char buf[16] = { 0 };
	CHECK(recv(s, buf, 5, MSG_PEEK) == 5 && !memcmp(buf, "hello", 5), "MSG_PEEK");
	CHECK(recv(s, buf, 5, 0) == 5 && !memcmp(buf, "hello", 5), "recv after the peek");
}

static void vectors_and_messages(int s)
{
	struct iovec out[3] = { { "a", 1 }, { "bc", 2 }, { "def", 3 } };
	CHECK(writev(s, out, 3) == 6, "writev: %s", strerror(errno));
	char x[2], y[10];
	struct iovec in[2] = { { x, sizeof x }, { y, sizeof y } };
	size_t got = 0;
	while (got < 6) {
		ssize_t r = readv(s, in, 2);
		CHECK(r > 0, "readv: %s", strerror(errno));
		/* Move past what was filled. */
		for (size_t k = 0; k < (size_t)r; k++) {
			char c = "abcdef"[got + k];
			char *at = got + k < 2 ? &x[got + k] : &y[got + k - 2];
			CHECK(*at == c, "readv byte %zu is %c, expected %c", got + k, *at, c);
		}
		got += (size_t)r;
		in[0].iov_len = got < 2 ? 2 - got : 0;
		in[0].iov_base = x + (got < 2 ? got : 2);
		in[1].iov_base = y + (got > 2 ? got - 2 : 0);
		in[1].iov_len = sizeof y - (got > 2 ? got - 2 : 0);
	}
	struct iovec mo[2] = { { "msg", 3 }, { "hdr", 3 } };
	struct msghdr m = { .msg_iov = mo, .msg_iovlen = 2 };
	CHECK(sendmsg(s, &m, MSG_NOSIGNAL) == 6, "sendmsg: %s", strerror(errno));
	char back[6];
	struct sockaddr_in from;
	struct iovec mi = { back, sizeof back };
	struct msghdr r = { .msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &mi,
			    .msg_iovlen = 1 };
	CHECK(recvmsg(s, &r, MSG_WAITALL) == 6 && !memcmp(back, "msghdr", 6), "recvmsg MSG_WAITALL");
	CHECK(r.msg_namelen == 0, "recvmsg on TCP gave a name of %u bytes", r.msg_namelen);
}

static void nonblocking_three_ways(int s)
{
	char buf[8];
	int fl = fcntl(s, F_GETFL);
	CHECK(fl >= 0 && !(fl & O_NONBLOCK), "F_GETFL: %d", fl);
	CHECK(fcntl(s, F_SETFL, fl | O_NONBLOCK) == 0, "F_SETFL: %s", strerror(errno));
	CHECK(fcntl(s, F_GETFL) & O_NONBLOCK, "O_NONBLOCK not kept");
	CHECK(read(s, buf, sizeof buf) == -1 && errno == EAGAIN, "non-blocking read: %s",
	      strerror(errno));
	CHECK(fcntl(s, F_SETFL, fl) == 0, "F_SETFL back");
	CHECK(recv(s, buf, sizeof buf, MSG_DONTWAIT) == -1 && errno == EAGAIN, "MSG_DONTWAIT: %s",
	      strerror(errno));
	int on = 1, off = 0;
	CHECK(ioctl(s, FIONBIO, &on) == 0, "FIONBIO: %s", strerror(errno));
	CHECK(recv(s, buf, sizeof buf, 0) == -1 && errno == EAGAIN, "after FIONBIO: %s",
	      strerror(errno));
	CHECK(ioctl(s, FIONBIO, &off) == 0, "FIONBIO off");
	CHECK(!(fcntl(s, F_GETFL) & O_NONBLOCK), "FIONBIO off kept O_NONBLOCK");
}

/* Returns the socket's number after the moves. */
static int duplicates(int s)
{
	int d = dup(s);
	CHECK(d >= 0 && d != s, "dup: %s", strerror(errno));
	CHECK(close(s) == 0, "close the original: %s", strerror(errno));
	echo_check(d, "through the copy");
	int p[2];
	CHECK(pipe(p) == 0, "pipe");
	/* dup2 onto a pipe's number: that number is now the socket. */
	CHECK(dup2(d, p[0]) == p[0], "dup2: %s", strerror(errno));
	echo_check(p[0], "through dup2");
	int c = fcntl(p[0], F_DUPFD_CLOEXEC, 100);
	CHECK(c >= 100 && (fcntl(c, F_GETFD) & FD_CLOEXEC), "F_DUPFD_CLOEXEC gave %d", c);
	CHECK(close(d) == 0 && close(p[0]) == 0, "closing copies");
	echo_check(c, "through the last copy");
	close(p[1]);
	return c;
}

static void waiting_on_both(int s)
{
	int p[2];
	CHECK(pipe(p) == 0, "pipe");
	/* poll: nothing ready, then the timeout. */
	struct pollfd fds[2] = { { .fd = p[0], .events = POLLIN }, { .fd = s, .events = POLLIN } };
	uint64_t t0 = now_ns();
	CHECK(poll(fds, 2, 50) == 0, "poll with nothing ready");
	CHECK(now_ns() - t0 >= 49000000ull, "poll returned after %llu ns",
	      (unsigned long long)(now_ns() - t0));
	/* poll wakes for the pipe (a kernel descriptor)... */
	struct later l = { p[1], 20, "x" };
	pthread_t t = start_later(&l);
	CHECK(poll(fds, 2, 5000) == 1 && fds[0].revents == POLLIN && fds[1].revents == 0,
	      "poll for the pipe: %#x %#x", fds[0].revents, fds[1].revents);
	PT(pthread_join(t, NULL));
	char c;
	CHECK(read(p[0], &c, 1) == 1, "reading the pipe");
	/* ...and for the socket. */
	struct later ls = { s, 20, "y" };
	t = start_later(&ls);
	CHECK(poll(fds, 2, 5000) == 1 && fds[1].revents & POLLIN, "poll for the socket");
	PT(pthread_join(t, NULL));
	CHECK(read(s, &c, 1) == 1 && c == 'y', "the socket's byte");

	/* select, the same two ways. */
	fd_set r;
	FD_ZERO(&r);
	FD_SET(p[0], &r);
	FD_SET(s, &r);
	struct timeval tv = { 0, 30000 };
	CHECK(select((p[0] > s ? p[0] : s) + 1, &r, NULL, NULL, &tv) == 0, "select, nothing ready");
	ls.bytes = "z";
	t = start_later(&ls);
	FD_ZERO(&r);
	FD_SET(p[0], &r);
	FD_SET(s, &r);
	tv = (struct timeval){ 5, 0 };
	CHECK(select((p[0] > s ? p[0] : s) + 1, &r, NULL, NULL, &tv) == 1 && FD_ISSET(s, &r) &&
		      !FD_ISSET(p[0], &r),
	      "select for the socket");
	PT(pthread_join(t, NULL));
	CHECK(read(s, &c, 1) == 1 && c == 'z', "the socket's byte");

	/* epoll with both, level-triggered, then one-shot. */
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event a = { .events = EPOLLIN, .data.fd = p[0] };
	struct epoll_event b = { .events = EPOLLIN | EPOLLONESHOT, .data.fd = s };
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &a) == 0 && epoll_ctl(ep, EPOLL_CTL_ADD, s, &b) == 0,
	      "EPOLL_CTL_ADD: %s", strerror(errno));
	CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, 1000, &b) == -1 && errno == EBADF, "MOD of no descriptor");
	struct epoll_event ev[4];
	CHECK(epoll_wait(ep, ev, 4, 20) == 0, "epoll_wait with nothing ready");
	l.bytes = "p";
	t = start_later(&l);
	CHECK(epoll_wait(ep, ev, 4, 5000) == 1 && ev[0].data.fd == p[0], "epoll for the pipe");
	PT(pthread_join(t, NULL));
	CHECK(read(p[0], &c, 1) == 1, "reading the pipe");
	ls.bytes = "q";
	t = start_later(&ls);
	CHECK(epoll_wait(ep, ev, 4, 5000) == 1 && ev[0].data.fd == s && (ev[0].events & EPOLLIN),
	      "epoll for the socket");
	PT(pthread_join(t, NULL));
	/* One-shot: not reported again, though still readable... */
	CHECK(epoll_wait(ep, ev, 4, 20) == 0, "a one-shot socket reported twice");
	/* ...until re-armed. */
	CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, &b) == 0, "re-arm: %s", strerror(errno));
	CHECK(epoll_wait(ep, ev, 4, 1000) == 1 && ev[0].data.fd == s, "re-armed");
	CHECK(read(s, &c, 1) == 1 && c == 'q', "the socket's byte");
	CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) == 0, "DEL: %s", strerror(errno));
	CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) == -1 && errno == ENOENT, "DEL twice: %s",
	      strerror(errno));
	close(ep);
	close(p[0]);
	close(p[1]);
}

static void options(int s)
{
	int one = 1, v = 0;
	socklen_t len = sizeof v;
	CHECK(setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0, "TCP_NODELAY");
	CHECK(getsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &len) == 0 && v == 1, "TCP_NODELAY read");
	CHECK(setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) == 0, "SO_KEEPALIVE");
	len = sizeof v;
	CHECK(getsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &v, &len) == 0 && v == 1, "SO_KEEPALIVE read");
	int size = 65536;
	CHECK(setsockopt(s, SOL_SOCKET, SO_RCVBUF, &size, sizeof size) == 0, "SO_RCVBUF");
	len = sizeof v;
	/* Linux doubles it for its bookkeeping. */
	CHECK(getsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, &len) == 0 && v == 2 * size, "SO_RCVBUF: %d",
	      v);
	struct linger lg = { 1, 5 };
	CHECK(setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0, "SO_LINGER");
	struct linger back;
	len = sizeof back;
	CHECK(getsockopt(s, SOL_SOCKET, SO_LINGER, &back, &len) == 0 && back.l_onoff == 1 &&
		      back.l_linger == 5,
	      "SO_LINGER read");
	len = sizeof v;
	CHECK(getsockopt(s, SOL_SOCKET, SO_ERROR, &v, &len) == 0 && v == 0, "SO_ERROR %d", v);
	len = sizeof v;
	CHECK(getsockopt(s, SOL_SOCKET, SO_TYPE, &v, &len) == 0 && v == SOCK_STREAM, "SO_TYPE");
	/* A wrong length: Linux's EINVAL. */
	char small = 1;
	CHECK(setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &small, 1) == -1 && errno == EINVAL,
	      "TCP_NODELAY with 1 byte: %s", strerror(errno));
}

static void ends(int s)
{
	CHECK(shutdown(s, SHUT_WR) == 0, "shutdown: %s", strerror(errno));
	/* The echo server sees the end and closes: we read the end too. */
	char buf[8];
	CHECK(read(s, buf, sizeof buf) == 0, "read after the peer closed");
	CHECK(send(s, "x", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE, "send after SHUT_WR: %s",
	      strerror(errno));
	CHECK(sigpipes == 0, "MSG_NOSIGNAL raised SIGPIPE");
	CHECK(write(s, "x", 1) == -1 && errno == EPIPE, "write after SHUT_WR: %s", strerror(errno));
	CHECK(sigpipes == 1, "write's EPIPE raised SIGPIPE %d times", sigpipes);
	CHECK(close(s) == 0, "close");
	CHECK(close(s) == -1 && errno == EBADF, "close twice: %s", strerror(errno));
}

static void loopback_stays_kernel(void)
{
	/* A listener on 127.0.0.1 and a client to it: the kernel's. */
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 4) == 0, "loopback listen");
	socklen_t len = sizeof a;
	CHECK(getsockname(l, (struct sockaddr *)&a, &len) == 0 && a.sin_port != 0, "loopback port");
	int c = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(connect(c, (struct sockaddr *)&a, sizeof a) == 0, "loopback connect: %s", strerror(errno));
	int s = accept(l, NULL, NULL);
	CHECK(s >= 0, "loopback accept: %s", strerror(errno));
	CHECK(write(c, "lo", 2) == 2, "loopback write");
	char buf[2];
	read_exact(s, buf, 2);
	close(c);
	close(s);
	close(l);
}

static void udp(struct sockaddr_in to)
{
	int u = socket(AF_INET, SOCK_DGRAM, 0);
	CHECK(u >= 0, "UDP socket: %s", strerror(errno));
	CHECK(sendto(u, "ping", 4, 0, (struct sockaddr *)&to, sizeof to) == 4, "sendto: %s",
	      strerror(errno));
	char buf[16];
	struct sockaddr_in from;
	socklen_t len = sizeof from;
	struct pollfd p = { .fd = u, .events = POLLIN };
	CHECK(poll(&p, 1, 5000) == 1, "poll for the datagram");
	CHECK(recvfrom(u, buf, sizeof buf, 0, (struct sockaddr *)&from, &len) == 4 &&
		      !memcmp(buf, "ping", 4),
	      "recvfrom");
	CHECK(len == sizeof from && from.sin_port == to.sin_port &&
		      from.sin_addr.s_addr == to.sin_addr.s_addr,
	      "the datagram's source");
	/* Connected: send and recv; a datagram cut to the buffer. */
	CHECK(connect(u, (struct sockaddr *)&to, sizeof to) == 0, "UDP connect: %s", strerror(errno));
	CHECK(send(u, "longer datagram", 15, 0) == 15, "send: %s", strerror(errno));
	char small[6];
	struct iovec v = { small, sizeof small };
	struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1 };
	CHECK(recvmsg(u, &m, 0) == 6 && (m.msg_flags & MSG_TRUNC) && !memcmp(small, "longer", 6),
	      "recvmsg of a long datagram");
	/* Several at once: sendmmsg, then recvmmsg gathers the echoes. */
	struct iovec sv[3] = { { "one", 3 }, { "two", 3 }, { "three", 5 } };
	struct mmsghdr out[3];
	memset(out, 0, sizeof out);
	for (int i = 0; i < 3; i++) {
		out[i].msg_hdr.msg_iov = &sv[i];
		out[i].msg_hdr.msg_iovlen = 1;
	}
	CHECK(sendmmsg(u, out, 3, 0) == 3 && out[2].msg_len == 5, "sendmmsg: %s", strerror(errno));
	char rb[3][16];
	struct iovec rv[3] = { { rb[0], 16 }, { rb[1], 16 }, { rb[2], 16 } };
	struct mmsghdr in[3];
	memset(in, 0, sizeof in);
	for (int i = 0; i < 3; i++) {
		in[i].msg_hdr.msg_iov = &rv[i];
		in[i].msg_hdr.msg_iovlen = 1;
	}
	int got = 0;
	uint64_t end = now_ns() + 5000000000ull;
	while (got < 3 && now_ns() < end) {
		struct pollfd pu = { .fd = u, .events = POLLIN };
		CHECK(poll(&pu, 1, 5000) == 1, "poll for the echoes");
		int n = recvmmsg(u, in + got, (unsigned)(3 - got), MSG_WAITFORONE, NULL);
		CHECK(n > 0, "recvmmsg: %s", strerror(errno));
		got += n;
	}
	CHECK(got == 3 && in[0].msg_len == 3 && !memcmp(rb[0], "one", 3) && in[2].msg_len == 5 &&
		      !memcmp(rb[2], "three", 5),
	      "recvmmsg gave %d datagrams", got);
	close(u);
}

static void address_in_use(void)
{
	int a = listen_on(7777, 0);
	int b = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in any = { .sin_family = AF_INET, .sin_port = htons(7777) };
	CHECK(bind(b, (struct sockaddr *)&any, sizeof any) == -1 && errno == EADDRINUSE,
	      "a second bind of port 7777: %s", strerror(errno));
	close(b);
	close(a);
}

/* A socket closed under one number while a dup of it lives on, and a new
 * socket given that number and added to the same epoll set: the old
 * one's last close leaves the new one in the set (epoll keys its members
 * by number and file). */
static void epoll_number_reused(struct sockaddr_in to)
{
	int a = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(a >= 0 && connect(a, (struct sockaddr *)&to, sizeof to) == 0, "connect: %s",
	      strerror(errno));
	int d = dup(a);
	CHECK(d >= 0, "dup: %s", strerror(errno));
	int ep = epoll_create1(0);
	CHECK(ep >= 0, "epoll_create1: %s", strerror(errno));
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 1 };
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, a, &ev) == 0, "adding the first socket: %s",
	      strerror(errno));
	close(a);
	int b = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(b >= 0 && connect(b, (struct sockaddr *)&to, sizeof to) == 0, "connect: %s",
	      strerror(errno));
	if (b != a) {
		CHECK(dup2(b, a) == a, "dup2: %s", strerror(errno));
		close(b);
		b = a;
	}
	ev.data.u64 = 2;
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev) == 0,
	      "adding a new socket under a closed one's number: %s", strerror(errno));
	close(d);
	CHECK(write(b, "x", 1) == 1, "write: %s", strerror(errno));
	struct epoll_event got;
	int n = epoll_wait(ep, &got, 1, 10000);
	CHECK(n == 1 && got.data.u64 == 2,
	      "the new socket's echo: %d event(s), data %llu (the old socket's last close "
	      "took the new one out of the set?)",
	      n, n == 1 ? (unsigned long long)got.data.u64 : 0ull);
	char c;
	read_exact(b, &c, 1);
	close(ep);
	close(b);
}

int main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: %s HOST PORT UDP_PORT", argv[0]);
	struct sockaddr_in to = addr_of(argv[1], atoi(argv[2]));
	struct sockaddr_in uto = addr_of(argv[1], atoi(argv[3]));
	signal(SIGPIPE, on_sigpipe);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0, "socket: %s", strerror(errno));
	CHECK(connect(s, (struct sockaddr *)&to, sizeof to) == 0, "connect: %s", strerror(errno));
	CHECK(connect(s, (struct sockaddr *)&to, sizeof to) == -1 && errno == EISCONN,
	      "connect twice: %s", strerror(errno));
	names_and_peeking(s, to);
	vectors_and_messages(s);
	nonblocking_three_ways(s);
	s = duplicates(s);
	waiting_on_both(s);
	options(s);
	ends(s);
	loopback_stays_kernel();
	address_in_use();
	epoll_number_reused(to);
	udp(uto);
	PASS("sock_api");
}
