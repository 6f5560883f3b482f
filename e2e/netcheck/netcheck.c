/*
 * netcheck: the program of the real node's test pods (scripts/node.sh check, e2e/tests/node.rs),
 * in an image of its own (scripts/install-deps.sh --node links it statically, as the pause
 * program). Three jobs, each what a NetworkPolicy or Service check needs and nothing more:
 *
 *   netcheck pause                  sleeps until SIGTERM or SIGINT (it is PID 1: no default
 *                                   handler would end it), then exits 0
 *   netcheck connect ADDR:PORT [S]  exits 0 when a TCP connection to ADDR (IPv4) opens within S
 *                                   seconds (3), 1 when it is refused or times out (why, on stderr)
 *   netcheck serve PORT             an HTTP/1.0 server on PORT: every request is answered 200
 *                                   with the host name (the pod's name); logs "serving HTTP on
 *                                   :PORT" and one line per request
 *
 * Ours rather than upstream's agnhost: agnhost is a 60 MB Go program whose static build took 5
 * to 11 minutes of make test's budget on a new machine, for these three jobs; busybox's nc has
 * no connect-only mode.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static int usage(void) {
  fputs("usage: netcheck pause | connect ADDR:PORT [SECONDS] | serve PORT\n", stderr);
  return 2;
}

/* parse_port: PORT as a number in 1..65535, or 0. */
static unsigned short parse_port(const char *s) {
  char *end;
  long port = strtol(s, &end, 10);
  return (*s && !*end && port > 0 && port < 65536) ? (unsigned short)port : 0;
}

static int check_connect(const char *target, int seconds) {
  char addr[64];
  const char *colon = strrchr(target, ':');
  struct sockaddr_in sa = {.sin_family = AF_INET};
  if (!colon || (size_t)(colon - target) >= sizeof addr) return usage();
  memcpy(addr, target, (size_t)(colon - target));
  addr[colon - target] = '\0';
  sa.sin_port = htons(parse_port(colon + 1));
  if (!sa.sin_port || inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
    fprintf(stderr, "netcheck: %s is not an IPv4 ADDR:PORT\n", target);
    return 2;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    perror("netcheck: socket");
    return 1;
  }
  int err = 0;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    if (errno != EINPROGRESS) {
      err = errno;
    } else {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int ready = poll(&p, 1, seconds * 1000);
      socklen_t len = sizeof err;
      if (ready == 0) {
        fprintf(stderr, "netcheck: %s: no connection within %d s\n", target, seconds);
        return 1;
      }
      if (ready < 0) err = errno;
      else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    }
  }
  close(fd);
  if (err) {
    fprintf(stderr, "netcheck: %s: %s\n", target, strerror(err));
    return 1;
  }
  printf("connected to %s\n", target);
  return 0;
}

static int serve(unsigned short port) {
  char host[256] = "unknown", request[1024], reply[512];
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
  gethostname(host, sizeof host - 1);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
      bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 64) < 0) {
    perror("netcheck: listen");
    return 1;
  }
  printf("serving HTTP on :%u\n", port);
  fflush(stdout);
  for (;;) {
    struct sockaddr_in peer;
    socklen_t len = sizeof peer;
    int c = accept(fd, (struct sockaddr *)&peer, &len);
    if (c < 0) continue;
    /* A client that sends nothing is not waited on for long. */
    struct timeval timeout = {.tv_sec = 2};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ssize_t n = read(c, request, sizeof request - 1);
    request[n > 0 ? n : 0] = '\0';
    request[strcspn(request, "\r\n")] = '\0';
    int body = (int)strlen(host);
    int size = snprintf(reply, sizeof reply,
                        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                        "Connection: close\r\n\r\n%s",
                        body, host);
    if (write(c, reply, (size_t)size) < 0) perror("netcheck: write");
    close(c);
    printf("%s from %s\n", request[0] ? request : "(no request)", inet_ntoa(peer.sin_addr));
    fflush(stdout);
  }
}

int main(int argc, char **argv) {
  signal(SIGTERM, stop);
  signal(SIGINT, stop);
  if (argc == 2 && !strcmp(argv[1], "pause")) {
    for (;;) pause();
  }
  if ((argc == 3 || argc == 4) && !strcmp(argv[1], "connect")) {
    int seconds = argc == 4 ? atoi(argv[3]) : 3;
    return check_connect(argv[2], seconds > 0 ? seconds : 3);
  }
  if (argc == 3 && !strcmp(argv[1], "serve")) {
    unsigned short port = parse_port(argv[2]);
    return port ? serve(port) : usage();
  }
  return usage();
}
