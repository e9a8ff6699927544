/*
 * vm-init: the guest-side half of sandbox-libkrun-vm, a tiny static program.
 *
 * libkrun's own init (init.krun) starts us as the workload. We read the launch file the
 * runner placed in the root's overlay (/.sandbox-vm-launch), mount the virtio-fs shares at
 * their guest paths, change directory and execve() the real workload with its exact argv
 * and environment. The launch file is a list of NUL-terminated strings, so arguments keep
 * every byte but NUL (libkrun's kernel-command-line and JSON routes both mangle some).
 *
 * Layout: "SVM1", nshares, {tag, guest_path, "ro"|"rw"} * nshares, workdir, workload,
 *         argc, arg * argc, envc, "NAME=value" * envc.
 * Exit 125 when we cannot start the workload, 127 when it does not exist (like podman).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define LAUNCH_FILE "/.sandbox-vm-launch"
#define MAX_LAUNCH (64 * 1024 * 1024)

static char *data;
static size_t data_len, pos;

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "sandbox-vm-init: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(125);
}

/* Next NUL-terminated field, or die if the file is truncated. */
static char *field(void)
{
    if (pos >= data_len)
        die("launch file truncated", NULL);
    char *start = data + pos;
    char *nul = memchr(start, '\0', data_len - pos);
    if (!nul)
        die("launch file field not terminated", NULL);
    pos = (size_t)(nul - data) + 1;
    return start;
}

static size_t count(void)
{
    char *end;
    char *text = field();
    errno = 0;
    unsigned long n = strtoul(text, &end, 10);
    if (errno || *end || n > MAX_LAUNCH)
        die("bad count in launch file", text);
    return n;
}

static void read_launch(void)
{
    int fd = open(LAUNCH_FILE, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        die("cannot open " LAUNCH_FILE, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || st.st_size <= 0 || st.st_size > MAX_LAUNCH)
        die("bad launch file size", NULL);
    data_len = (size_t)st.st_size;
    data = malloc(data_len);
    if (!data)
        die("out of memory", NULL);
    size_t got = 0;
    while (got < data_len) {
        ssize_t n = read(fd, data + got, data_len - got);
        if (n <= 0)
            die("cannot read launch file", n < 0 ? strerror(errno) : "short read");
        got += (size_t)n;
    }
    close(fd);
}

/* mkdir -p */
static void make_dirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    mkdir(path, 0755);
}

int main(void)
{
    read_launch();
    if (strcmp(field(), "SVM1") != 0)
        die("launch file has an unknown format", NULL);

    size_t nshares = count();
    for (size_t i = 0; i < nshares; i++) {
        char *tag = field(), *guest_path = field(), *mode = field();
        unsigned long flags = strcmp(mode, "ro") == 0 ? MS_RDONLY : 0;
        make_dirs(guest_path);
        if (mount(tag, guest_path, "virtiofs", flags, NULL) != 0) {
            fprintf(stderr, "sandbox-vm-init: mount %s at %s: %s\n", tag, guest_path,
                    strerror(errno));
            exit(125);
        }
    }

    char *workdir = field();
    char *workload = field();
    size_t argc = count();
    char **argv = calloc(argc + 2, sizeof(char *));
    if (!argv)
        die("out of memory", NULL);
    argv[0] = workload;
    for (size_t i = 0; i < argc; i++)
        argv[i + 1] = field();
    size_t envc = count();
    char **envp = calloc(envc + 1, sizeof(char *));
    if (!envp)
        die("out of memory", NULL);
    for (size_t i = 0; i < envc; i++)
        envp[i] = field();

    if (chdir(workdir) != 0)
        die("cannot enter workdir", workdir);
    execve(workload, argv, envp);
    fprintf(stderr, "sandbox-vm-init: cannot execute %s: %s\n", workload, strerror(errno));
    return errno == ENOENT ? 127 : 126;
}
