/*
 * vm-init: the guest-side half of sandbox-libkrun-vm, a tiny static program.
 *
 * libkrun's own init (init.krun) starts us as the workload. We read the launch file the
 * runner placed in the root's overlay (/.sandbox-vm-launch), mount the virtio-fs shares at
 * their guest paths, change directory and execve() the real workload with its exact argv
 * and environment. The launch file is a list of NUL-terminated strings, so arguments keep
 * every byte but NUL (libkrun's kernel-command-line and JSON routes both mangle some).
 *
 * Layout: "SVM2", nshares, {tag, guest_path, "ro"|"rw"} * nshares,
 *         "0" | "1" nbinds {"root"|"layer", source, guest_path, "ro"|"rw"} * nbinds,
 *         workdir, workload, argc, arg * argc, envc, "NAME=value" * envc.
 *
 * "1" (a guest disk): the writable layer is the VM's virtio-blk disk /dev/vda (ext4). We
 * mount it, lay an overlay of our own over the shared root with its upper and work there,
 * bind each listed path over that overlay as it was ("root": the same path of the shared
 * root, a share or a mount the runner made; "layer": a directory of the disk, made if
 * missing), move /dev, /proc and /sys into it and make it our root. Every write of the guest
 * then lands on the disk, bounded by its size, and persists with it.
 *
 * Exit 125 when we cannot start the workload, 127 when it does not exist (like podman).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
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

#define LAYER "/.iii-layer"
#define NEW_ROOT "/.iii-root"
#define MAX_PATH 4096

static void must_mount(const char *source, const char *target, const char *type,
                       unsigned long flags, const char *options)
{
    if (mount(source, target, type, flags, options) != 0) {
        fprintf(stderr, "sandbox-vm-init: mount %s at %s: %s\n", source ? source : "(none)",
                target, strerror(errno));
        exit(125);
    }
}

static void join(char *out, const char *a, const char *b)
{
    if ((size_t)snprintf(out, MAX_PATH, "%s%s", a, b) >= MAX_PATH)
        die("path too long", b);
}

/* Makes a mount point for `source` at `target`: a directory, or an empty file for a file. */
static void mount_point(const char *source, char *target)
{
    struct stat st;
    if (stat(source, &st) != 0)
        die("cannot find what to bind", source);
    if (S_ISDIR(st.st_mode)) {
        make_dirs(target);
        return;
    }
    char *slash = strrchr(target, '/');
    if (slash && slash != target) {
        *slash = '\0';
        make_dirs(target);
        *slash = '/';
    }
    int fd = open(target, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0)
        close(fd);
}

/* The disk's device node: /dev/vda, or one made from /sys when /dev has none. */
static const char *disk_device(void)
{
    if (access("/dev/vda", F_OK) == 0)
        return "/dev/vda";
    FILE *dev = fopen("/sys/block/vda/dev", "re");
    unsigned major, minor;
    if (!dev || fscanf(dev, "%u:%u", &major, &minor) != 2)
        die("no virtio-blk disk vda", NULL);
    fclose(dev);
    if (mknod("/.iii-vda", S_IFBLK | 0600, makedev(major, minor)) != 0 && errno != EEXIST)
        die("cannot make the disk's device node", strerror(errno));
    return "/.iii-vda";
}

/* The guest disk: its overlay becomes our root, the listed paths bound over it again. */
static void guest_layer(void)
{
    size_t nbinds = count();
    /* pivot_root and MS_MOVE refuse a shared root (EINVAL): nothing of ours propagates. */
    must_mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    mkdir(LAYER, 0700);
    must_mount(disk_device(), LAYER, "ext4", MS_NOSUID | MS_NODEV, NULL);
    mkdir(LAYER "/upper", 0755);
    mkdir(LAYER "/work", 0755);
    mkdir(NEW_ROOT, 0755);
    must_mount("overlay", NEW_ROOT, "overlay", 0,
               "lowerdir=/,upperdir=" LAYER "/upper,workdir=" LAYER "/work");
    char source[MAX_PATH], target[MAX_PATH];
    for (size_t i = 0; i < nbinds; i++) {
        char *kind = field(), *from = field(), *guest_path = field(), *mode = field();
        if (strcmp(kind, "layer") == 0) {
            if (strchr(from, '/') || !strcmp(from, "upper") || !strcmp(from, "work"))
                die("bad layer directory", from);
            join(source, LAYER "/", from);
            mkdir(source, 0755);
        } else if (strcmp(kind, "root") == 0) {
            join(source, "", from);
        } else {
            die("unknown bind kind", kind);
        }
        join(target, NEW_ROOT, guest_path);
        mount_point(source, target);
        must_mount(source, target, NULL, MS_BIND | MS_REC, NULL);
        if (strcmp(mode, "ro") == 0)
            must_mount(NULL, target, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL);
    }
    /* What libkrun's init mounted: moved, with everything below them. */
    const char *keep[] = {"/dev", "/proc", "/sys"};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) {
        join(target, NEW_ROOT, keep[i]);
        make_dirs(target);
        if (mount(keep[i], target, NULL, MS_MOVE, NULL) != 0 && errno != EINVAL)
            die("cannot move a mount into the new root", keep[i]);
    }
    if (chdir(NEW_ROOT) != 0)
        die("cannot enter the new root", strerror(errno));
    /* pivot_root(".", "."): the old root ends up under the new one, then is detached. A
     * root pivot_root refuses (an initial ramfs) is covered by moving the new one over it. */
    if (syscall(SYS_pivot_root, ".", ".") == 0) {
        if (umount2(".", MNT_DETACH) != 0)
            die("cannot detach the shared root", strerror(errno));
    } else {
        fprintf(stderr, "sandbox-vm-init: pivot_root: %s; moving the new root instead\n",
                strerror(errno));
        must_mount(".", "/", NULL, MS_MOVE, NULL);
        if (chroot(".") != 0)
            die("cannot enter the new root", strerror(errno));
    }
    if (chdir("/") != 0)
        die("cannot enter the new root", strerror(errno));
}

int main(void)
{
    read_launch();
    if (strcmp(field(), "SVM2") != 0)
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

    char *layer = field();
    if (strcmp(layer, "1") == 0)
        guest_layer();
    else if (strcmp(layer, "0") != 0)
        die("bad layer flag in launch file", layer);

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
