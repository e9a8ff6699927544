/*
 * vsock-helper: a static test helper run inside microVMs by vm-runner's tests (busybox has
 * no vsock client). Not part of the product.
 *
 *   vsock-helper connect PORT MESSAGE   connect to the host (CID 2), send MESSAGE and a
 *                                       newline, print the whole reply
 *   vsock-helper serve PORT             accept one connection, reply "echo:" + what came
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* Before linux/vm_sockets.h: Linux 6.1's header (bookworm's) uses struct sockaddr without
 * including it. */
#include <sys/socket.h>
#include <linux/vm_sockets.h>
#include <unistd.h>

static int fail(const char *what)
{
    fprintf(stderr, "vsock-helper: %s: %s\n", what, strerror(errno));
    return 1;
}

static int write_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t n = write(fd, buf, len);
        if (n <= 0)
            return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static int do_connect(unsigned port, const char *message)
{
    struct sockaddr_vm addr = {.svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_HOST, .svm_port = port};
    int fd = socket(AF_VSOCK, SOCK_STREAM, 0);
    if (fd < 0)
        return fail("socket");
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0)
        return fail("connect");
    if (write_all(fd, message, strlen(message)) || write_all(fd, "\n", 1))
        return fail("write");
    shutdown(fd, SHUT_WR);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        fwrite(buf, 1, (size_t)n, stdout);
    return n < 0 ? fail("read") : 0;
}

static int do_serve(unsigned port)
{
    struct sockaddr_vm addr = {.svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = port};
    int fd = socket(AF_VSOCK, SOCK_STREAM, 0);
    if (fd < 0)
        return fail("socket");
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0)
        return fail("bind");
    if (listen(fd, 1) != 0)
        return fail("listen");
    /* Tell whoever watches the console that the port is open. */
    printf("vsock-helper: listening on %u\n", port);
    fflush(stdout);
    int conn = accept(fd, NULL, NULL);
    if (conn < 0)
        return fail("accept");
    char buf[4096];
    size_t used = 0;
    ssize_t n;
    while (used < sizeof buf && (n = read(conn, buf + used, sizeof buf - used)) > 0) {
        used += (size_t)n;
        if (memchr(buf, '\n', used))
            break;
    }
    if (write_all(conn, "echo:", 5) || write_all(conn, buf, used))
        return fail("write");
    close(conn);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "connect") == 0)
        return do_connect((unsigned)strtoul(argv[2], NULL, 10), argv[3]);
    if (argc == 3 && strcmp(argv[1], "serve") == 0)
        return do_serve((unsigned)strtoul(argv[2], NULL, 10));
    fprintf(stderr, "usage: vsock-helper connect PORT MESSAGE | serve PORT\n");
    return 2;
}
