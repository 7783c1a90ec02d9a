/*
 * gpuvm-nvtest: the guest program gpuvm's `nouveau` command runs as init inside User-Mode
 * Linux. Written by the gpuvm project. Uses only nouveau's own userspace interface (its DRM
 * ioctls): it reports the device, opens a channel, and has the GPU do semaphore work that can
 * only complete if the channel, nouveau's page tables (shadowed by gpuvm) and both memory
 * kinds work:
 *   1. release 0x1234abcd to a VRAM buffer;
 *   2. acquire on that VRAM word (the channel waits until it equals 0x1234abcd);
 *   3. release 0x600dcafe to a GART (system memory) buffer, which the CPU then reads.
 * Then work whose result only the GPU can have produced, every byte checked by the CPU:
 *   ttm-move: a 256 KiB GART buffer filled by the CPU is forced into VRAM (a pushbuf that
 *     allows it only VRAM: nouveau's TTM moves it with its buffer-move engine, M2MF or the
 *     copy engine), checked there by a GPU semaphore acquire on two of its words, forced back
 *     to GART the same way, and read back by the CPU;
 *   m2mf-copy: a userspace M2MF object (class 0x9039) copies GART -> VRAM -> GART, the second
 *     time with different line pitches, then writes inline data and releases a semaphore;
 *   ce-copy: the same with the copy engine (class 0x90b5);
 *   refused-3d: on a channel of its own, the 3D class (0x9097), which the simulated GPU does
 *     not execute, is bound: the binding must be refused (the channel stops, nouveau reports
 *     it) and the semaphore release after it must never land.
 * VRAM cannot be mapped into a process under UML, so VRAM is checked through the GPU.
 * Every result is one line starting with "gpuvm-nvtest:"; the host parses them.
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <drm/drm.h>
#include <drm/nouveau_drm.h>

#define SEM_A 0x010
#define SEM_B 0x014
#define SEM_C 0x018
#define SEM_D 0x01c
#define SEM_ACQUIRE_EQ 1
#define SEM_RELEASE 2
#define SEM_RELEASE_4BYTE (1u << 24)

static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	printf("gpuvm-nvtest: %s\n", buf);
	fflush(stdout);
}

/* Every buffer mapping and the DRM device, released before power-off as a system's shutdown
 * would: nouveau 6.12's removal (run at power-off while the transport still works) evicts
 * buffers that are still alive after it has freed its channels, and crashes in
 * nouveau_fence_sync. */
#define MAX_MAPS 16
static struct {
	void *p;
	size_t len;
} maps[MAX_MAPS];
static int drm_fd = -1;

static void *map_bo(int fd, size_t len, uint64_t handle)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, handle);
	for (int i = 0; p != MAP_FAILED && i < MAX_MAPS; i++)
		if (!maps[i].p) {
			maps[i].p = p;
			maps[i].len = len;
			break;
		}
	return p;
}

static void release_all(void)
{
	for (int i = 0; i < MAX_MAPS; i++)
		if (maps[i].p) {
			munmap(maps[i].p, maps[i].len);
			maps[i].p = NULL;
		}
	if (drm_fd >= 0)
		close(drm_fd);
	drm_fd = -1;
}

static void finish(int code)
{
	out("done (%d)", code);
	release_all();
	sync();
	reboot(RB_POWER_OFF);
	_exit(code);
}

static uint32_t incr_sc(uint32_t subc, uint32_t mthd, uint32_t count)
{
	/* Fermi incrementing method header. */
	return 0x20000000u | (count << 16) | (subc << 13) | (mthd >> 2);
}

static uint32_t incr(uint32_t mthd, uint32_t count)
{
	return incr_sc(0, mthd, count);
}

static uint32_t nonincr_sc(uint32_t subc, uint32_t mthd, uint32_t count)
{
	/* Fermi non-incrementing method header. */
	return 0x60000000u | (count << 16) | (subc << 13) | (mthd >> 2);
}

static uint32_t *sem(uint32_t *p, uint64_t va, uint32_t payload, uint32_t op)
{
	*p++ = incr(SEM_A, 4);
	*p++ = (uint32_t)(va >> 32) & 0xff;
	*p++ = (uint32_t)va;
	*p++ = payload;
	*p++ = op;
	return p;
}

static int gem_new_size(int fd, uint32_t domain, uint64_t size, struct drm_nouveau_gem_info *info)
{
	struct drm_nouveau_gem_new req;
	memset(&req, 0, sizeof(req));
	req.info.size = size;
	req.info.domain = domain;
	req.align = 4096;
	if (ioctl(fd, DRM_IOCTL_NOUVEAU_GEM_NEW, &req))
		return -errno;
	*info = req.info;
	return 0;
}

static int gem_new(int fd, uint32_t domain, struct drm_nouveau_gem_info *info)
{
	return gem_new_size(fd, domain, 4096, info);
}

static uint32_t pattern(uint32_t i, uint32_t seed)
{
	uint32_t x = i * 0x9e3779b9u ^ seed;
	x ^= x >> 15;
	x *= 0x85ebca6bu;
	x ^= x >> 13;
	return x;
}

/* One pushbuf submission of `words` dwords at the start of the push buffer (index `push_idx`
 * of `bos`). */
static int submit(int fd, int channel, struct drm_nouveau_gem_pushbuf_bo *bos, int nr_bos,
		  int push_idx, uint32_t *p0, uint32_t *end)
{
	struct drm_nouveau_gem_pushbuf_push pe = {
		.bo_index = push_idx, .offset = 0, .length = (uint64_t)((char *)end - (char *)p0)};
	struct drm_nouveau_gem_pushbuf pb;
	memset(&pb, 0, sizeof(pb));
	pb.channel = channel;
	pb.nr_buffers = nr_bos;
	pb.buffers = (uintptr_t)bos;
	pb.nr_push = 1;
	pb.push = (uintptr_t)&pe;
	if (ioctl(fd, DRM_IOCTL_NOUVEAU_GEM_PUSHBUF, &pb))
		return -errno;
	return 0;
}

static void bo_entry(struct drm_nouveau_gem_pushbuf_bo *b, uint32_t handle, uint32_t domains,
		     int write)
{
	memset(b, 0, sizeof(*b));
	b->handle = handle;
	b->valid_domains = domains;
	if (write)
		b->write_domains = domains;
	else
		b->read_domains = domains;
}

/* Waits (bounded) until the GART word reads `want`. */
static int wait_word(volatile uint32_t *w, uint32_t want)
{
	for (int i = 0; i < 4000 && *w != want; i++)
		usleep(1000);
	return *w == want;
}

static int cpu_prep(int fd, uint32_t handle)
{
	struct drm_nouveau_gem_cpu_prep prep = {.handle = handle, .flags = 0};
	return ioctl(fd, DRM_IOCTL_NOUVEAU_GEM_CPU_PREP, &prep) ? -errno : 0;
}

static const char *domain_name(uint32_t d)
{
	return d & NOUVEAU_GEM_DOMAIN_VRAM ? "VRAM" : d & NOUVEAU_GEM_DOMAIN_GART ? "GART" : "?";
}

static int bo_domain(int fd, uint32_t handle, uint32_t *domain)
{
	struct drm_nouveau_gem_info info;
	memset(&info, 0, sizeof(info));
	info.handle = handle;
	if (ioctl(fd, DRM_IOCTL_NOUVEAU_GEM_INFO, &info))
		return -errno;
	*domain = info.domain;
	return 0;
}

#define MOVE_BYTES (256u << 10)

/* ttm-move: see the header. `st` is the mapped GART status buffer (`status` its handle),
 * `p0` the mapped push buffer. Returns 0 on success. */
static int ttm_move(int fd, int channel, struct drm_nouveau_gem_info *status,
		    volatile uint32_t *st, struct drm_nouveau_gem_info *push, uint32_t *p0)
{
	/* nouveau restricts a buffer's domains on Tesla and later to those it was created with:
	 * created for both, placed in VRAM first. */
	struct drm_nouveau_gem_info bo;
	const uint32_t both = NOUVEAU_GEM_DOMAIN_VRAM | NOUVEAU_GEM_DOMAIN_GART;
	int r = gem_new_size(fd, both, MOVE_BYTES, &bo);
	if (r) {
		out("FAIL ttm-move: gem new: %s", strerror(-r));
		return 1;
	}
	uint32_t d0 = 0, dg = 0, d1 = 0, d2 = 0;
	bo_domain(fd, bo.handle, &d0);
	struct drm_nouveau_gem_pushbuf_bo bos[3];
	bo_entry(&bos[1], status->handle, NOUVEAU_GEM_DOMAIN_GART, 1);
	bo_entry(&bos[2], push->handle, NOUVEAU_GEM_DOMAIN_GART, 0);
	/* Step 0: allowed only GART, so the CPU can fill it (a process cannot map VRAM under
	 * UML). */
	st[1] = 0;
	bo_entry(&bos[0], bo.handle, NOUVEAU_GEM_DOMAIN_GART, 1);
	uint32_t *p = p0;
	p = sem(p, status->offset + 4, 0x10, SEM_RELEASE | SEM_RELEASE_4BYTE);
	if ((r = submit(fd, channel, bos, 3, 2, p0, p))) {
		out("FAIL ttm-move: pushbuf (GART only, first): %s", strerror(-r));
		return 1;
	}
	if (!wait_word(&st[1], 0x10) || cpu_prep(fd, bo.handle)) {
		out("FAIL ttm-move: the first move to GART did not complete");
		return 1;
	}
	bo_domain(fd, bo.handle, &dg);
	volatile uint32_t *m = map_bo(fd, MOVE_BYTES, bo.map_handle);
	if (m == MAP_FAILED) {
		out("FAIL ttm-move: mmap: %s", strerror(errno));
		return 1;
	}
	const uint32_t n = MOVE_BYTES / 4, seed = 0x7711;
	for (uint32_t i = 0; i < n; i++)
		m[i] = pattern(i, seed);
	/* Step 1: the buffer allowed only VRAM; the GPU acquires on its first and last words (so
	 * the pushbuf completes only if the data is in VRAM), then releases a status word. */
	bo_entry(&bos[0], bo.handle, NOUVEAU_GEM_DOMAIN_VRAM, 0);
	/* The buffer's GPU VA is the same in every domain. */
	p = p0;
	p = sem(p, bo.offset, pattern(0, seed), SEM_ACQUIRE_EQ);
	p = sem(p, bo.offset + MOVE_BYTES - 4, pattern(n - 1, seed), SEM_ACQUIRE_EQ);
	p = sem(p, status->offset + 4, 0x11, SEM_RELEASE | SEM_RELEASE_4BYTE);
	if ((r = submit(fd, channel, bos, 3, 2, p0, p))) {
		out("FAIL ttm-move: pushbuf (VRAM only): %s", strerror(-r));
		return 1;
	}
	if (!wait_word(&st[1], 0x11)) {
		out("FAIL ttm-move: the GPU did not find the data in VRAM (status 0x%x)", st[1]);
		return 1;
	}
	bo_domain(fd, bo.handle, &d1);
	/* Step 2: back to GART only. */
	bo_entry(&bos[0], bo.handle, NOUVEAU_GEM_DOMAIN_GART, 0);
	p = p0;
	p = sem(p, status->offset + 4, 0x22, SEM_RELEASE | SEM_RELEASE_4BYTE);
	if ((r = submit(fd, channel, bos, 3, 2, p0, p))) {
		out("FAIL ttm-move: pushbuf (GART only): %s", strerror(-r));
		return 1;
	}
	if (!wait_word(&st[1], 0x22) || cpu_prep(fd, bo.handle)) {
		out("FAIL ttm-move: the move back to GART did not complete");
		return 1;
	}
	bo_domain(fd, bo.handle, &d2);
	uint32_t bad = 0, first = n;
	for (uint32_t i = 0; i < n; i++)
		if (m[i] != pattern(i, seed)) {
			bad++;
			if (first == n)
				first = i;
		}
	if (bad || !(dg & NOUVEAU_GEM_DOMAIN_GART) || !(d1 & NOUVEAU_GEM_DOMAIN_VRAM) ||
	    !(d2 & NOUVEAU_GEM_DOMAIN_GART)) {
		out("FAIL ttm-move: %u of %u words differ (first at %u), domains %s -> %s -> %s -> %s",
		    bad, n, first, domain_name(d0), domain_name(dg), domain_name(d1),
		    domain_name(d2));
		return 1;
	}
	out("PASS ttm-move: %u KiB %s -> %s (CPU fill) -> %s (GPU-checked) -> %s moved by "
	    "nouveau's TTM, %u words CPU-checked",
	    MOVE_BYTES >> 10, domain_name(d0), domain_name(dg), domain_name(d1), domain_name(d2),
	    n);
	return 0;
}

/* Method offsets of the two copy classes (OGD cl9039.h, cl90b5.h). */
#define M2MF_OFFSET_OUT_UPPER 0x238
#define M2MF_LAUNCH_DMA 0x300
#define M2MF_LOAD_INLINE_DATA 0x304
#define M2MF_OFFSET_IN_UPPER 0x30c
#define M2MF_SET_SEMAPHORE_A 0x32c
#define CE_SET_SEMAPHORE_A 0x240
#define CE_LAUNCH_DMA 0x300
#define CE_OFFSET_IN_UPPER 0x400

#define COPY_BYTES (64u << 10)

/* The object allocation Mesa still uses on Fermi (the 6.12 UAPI header keeps only its number,
 * "deprecated"; the layout is libdrm's and nouveau's abi16 one). */
struct gpuvm_grobj_alloc {
	int32_t channel;
	uint32_t handle;
	int32_t klass;
};
#define GPUVM_IOCTL_GROBJ_ALLOC \
	DRM_IOW(DRM_COMMAND_BASE + DRM_NOUVEAU_GROBJ_ALLOC, struct gpuvm_grobj_alloc)

/* One pitch copy by `klass` on subchannel `sc`; releases `payload` at `sem_va` when done. */
static uint32_t *copy_cmd(uint32_t *p, uint32_t klass, uint32_t sc, uint64_t src, uint64_t dst,
			  uint32_t pitch_in, uint32_t pitch_out, uint32_t len, uint32_t lines,
			  uint64_t sem_va, uint32_t payload)
{
	if (klass == 0x9039) {
		*p++ = incr_sc(sc, M2MF_OFFSET_OUT_UPPER, 2);
		*p++ = (uint32_t)(dst >> 32);
		*p++ = (uint32_t)dst;
		*p++ = incr_sc(sc, M2MF_OFFSET_IN_UPPER, 6);
		*p++ = (uint32_t)(src >> 32);
		*p++ = (uint32_t)src;
		*p++ = pitch_in;
		*p++ = pitch_out;
		*p++ = len;
		*p++ = lines;
		*p++ = incr_sc(sc, M2MF_SET_SEMAPHORE_A, 3);
		*p++ = (uint32_t)(sem_va >> 32);
		*p++ = (uint32_t)sem_va;
		*p++ = payload;
		/* pitch in/out, RELEASE_SEMAPHORE, one-word semaphore. */
		*p++ = incr_sc(sc, M2MF_LAUNCH_DMA, 1);
		*p++ = (1u << 4) | (1u << 8) | (2u << 12) | (1u << 20);
	} else {
		*p++ = incr_sc(sc, CE_SET_SEMAPHORE_A, 3);
		*p++ = (uint32_t)(sem_va >> 32);
		*p++ = (uint32_t)sem_va;
		*p++ = payload;
		*p++ = incr_sc(sc, CE_OFFSET_IN_UPPER, 8);
		*p++ = (uint32_t)(src >> 32);
		*p++ = (uint32_t)src;
		*p++ = (uint32_t)(dst >> 32);
		*p++ = (uint32_t)dst;
		*p++ = pitch_in;
		*p++ = pitch_out;
		*p++ = len;
		*p++ = lines;
		/* non-pipelined, flush, one-word semaphore, pitch in/out, multi-line. */
		*p++ = incr_sc(sc, CE_LAUNCH_DMA, 1);
		*p++ = 2u | (1u << 2) | (1u << 3) | (1u << 7) | (1u << 8) | (1u << 9);
	}
	return p;
}

/* refused-3d: see the header. */
static int refused_3d(int fd, struct drm_nouveau_gem_info *status, volatile uint32_t *st,
		      struct drm_nouveau_gem_info *push, uint32_t *p0)
{
	struct drm_nouveau_channel_alloc ch;
	memset(&ch, 0, sizeof(ch));
	if (ioctl(fd, DRM_IOCTL_NOUVEAU_CHANNEL_ALLOC, &ch)) {
		out("FAIL refused-3d: channel alloc: %s", strerror(errno));
		return 1;
	}
	struct gpuvm_grobj_alloc g = {.channel = ch.channel, .handle = 0xbeef9097u,
				      .klass = 0x9097};
	if (ioctl(fd, GPUVM_IOCTL_GROBJ_ALLOC, &g)) {
		out("FAIL refused-3d: object class 0x9097: %s", strerror(errno));
		return 1;
	}
	st[3] = 0;
	uint32_t *p = p0;
	*p++ = incr_sc(3, 0x0000, 1); /* SET_OBJECT */
	*p++ = 0x9097;
	p = sem(p, status->offset + 12, 0xdead3d, SEM_RELEASE | SEM_RELEASE_4BYTE);
	struct drm_nouveau_gem_pushbuf_bo bos[2];
	bo_entry(&bos[0], status->handle, NOUVEAU_GEM_DOMAIN_GART, 1);
	bo_entry(&bos[1], push->handle, NOUVEAU_GEM_DOMAIN_GART, 0);
	int r = submit(fd, ch.channel, bos, 2, 1, p0, p);
	/* Either the submission is refused outright or it runs and stops at the binding. */
	for (int i = 0; r == 0 && i < 500 && st[3] != 0xdead3d; i++)
		usleep(1000);
	if (st[3] == 0xdead3d) {
		out("FAIL refused-3d: the work after binding class 0x9097 ran");
		return 1;
	}
	out("PASS refused-3d: binding class 0x9097 (not executed by the model) stopped channel %d "
	    "before its release (%s)",
	    ch.channel, r ? strerror(-r) : "submitted");
	return 0;
}

/* m2mf-copy / ce-copy: see the header. */
static int user_copy(int fd, int channel, uint32_t klass, const char *what,
		     struct drm_nouveau_gem_info *status, volatile uint32_t *st,
		     struct drm_nouveau_gem_info *push, uint32_t *p0)
{
	struct gpuvm_grobj_alloc g = {.channel = channel, .handle = 0xbeef0000u | klass,
				      .klass = (int32_t)klass};
	if (ioctl(fd, GPUVM_IOCTL_GROBJ_ALLOC, &g)) {
		out("FAIL %s: object class 0x%04x: %s", what, klass, strerror(errno));
		return 1;
	}
	struct drm_nouveau_gem_info src, vram, dst;
	int r;
	if ((r = gem_new_size(fd, NOUVEAU_GEM_DOMAIN_GART, COPY_BYTES, &src)) ||
	    (r = gem_new_size(fd, NOUVEAU_GEM_DOMAIN_VRAM, COPY_BYTES, &vram)) ||
	    (r = gem_new_size(fd, NOUVEAU_GEM_DOMAIN_GART, COPY_BYTES, &dst))) {
		out("FAIL %s: gem new: %s", what, strerror(-r));
		return 1;
	}
	volatile uint32_t *s = map_bo(fd, COPY_BYTES, src.map_handle);
	volatile uint8_t *d = map_bo(fd, COPY_BYTES, dst.map_handle);
	if (s == MAP_FAILED || d == MAP_FAILED) {
		out("FAIL %s: mmap: %s", what, strerror(errno));
		return 1;
	}
	const uint32_t seed = klass;
	for (uint32_t i = 0; i < COPY_BYTES / 4; i++)
		s[i] = pattern(i, seed);
	memset((void *)d, 0xa5, COPY_BYTES);
	const uint32_t sc = klass == 0x9039 ? 1 : 2;
	/* Pitches of the second copy: 96 lines of 600 bytes, read every 640 bytes and packed. */
	const uint32_t len = 600, lines = 96, pin = 640;
	uint32_t *p = p0;
	*p++ = incr_sc(sc, 0x0000, 1); /* SET_OBJECT */
	*p++ = klass;
	p = copy_cmd(p, klass, sc, src.offset, vram.offset, 4096, 4096, 4096, COPY_BYTES / 4096,
		     status->offset + 8, 0x100);
	p = copy_cmd(p, klass, sc, vram.offset, dst.offset, pin, len, len, lines,
		     status->offset + 8, 0x101);
	int inline_words = 0;
	if (klass == 0x9039) {
		/* Inline data: 3 words after the copied lines (one line of 12 bytes). */
		uint64_t at = dst.offset + (uint64_t)len * lines;
		*p++ = incr_sc(sc, M2MF_OFFSET_OUT_UPPER, 2);
		*p++ = (uint32_t)(at >> 32);
		*p++ = (uint32_t)at;
		*p++ = incr_sc(sc, 0x31c, 2); /* LINE_LENGTH_IN, LINE_COUNT */
		*p++ = 12;
		*p++ = 1;
		*p++ = incr_sc(sc, M2MF_SET_SEMAPHORE_A, 3);
		*p++ = (uint32_t)((status->offset + 8) >> 32);
		*p++ = (uint32_t)(status->offset + 8);
		*p++ = 0x102;
		*p++ = incr_sc(sc, M2MF_LAUNCH_DMA, 1);
		*p++ = 1u | (1u << 8) | (2u << 12) | (1u << 20); /* inline, pitch out, semaphore */
		*p++ = nonincr_sc(sc, M2MF_LOAD_INLINE_DATA, 3);
		*p++ = 0x11111111;
		*p++ = 0x22222222;
		*p++ = 0x33333333;
		inline_words = 3;
	}
	st[2] = 0;
	struct drm_nouveau_gem_pushbuf_bo bos[5];
	bo_entry(&bos[0], src.handle, NOUVEAU_GEM_DOMAIN_GART, 0);
	bo_entry(&bos[1], vram.handle, NOUVEAU_GEM_DOMAIN_VRAM, 1);
	bo_entry(&bos[2], dst.handle, NOUVEAU_GEM_DOMAIN_GART, 1);
	bo_entry(&bos[3], status->handle, NOUVEAU_GEM_DOMAIN_GART, 1);
	bo_entry(&bos[4], push->handle, NOUVEAU_GEM_DOMAIN_GART, 0);
	if ((r = submit(fd, channel, bos, 5, 4, p0, p))) {
		out("FAIL %s: pushbuf: %s", what, strerror(-r));
		return 1;
	}
	uint32_t want = inline_words ? 0x102 : 0x101;
	if (!wait_word(&st[2], want) || cpu_prep(fd, dst.handle)) {
		out("FAIL %s: not completed (semaphore 0x%x, want 0x%x)", what, st[2], want);
		return 1;
	}
	uint32_t bad = 0;
	for (uint32_t l = 0; l < lines; l++)
		for (uint32_t j = 0; j < len; j++) {
			uint32_t o = l * pin + j;
			uint8_t e = (uint8_t)(pattern(o / 4, seed) >> (8 * (o % 4)));
			if (d[l * len + j] != e)
				bad++;
		}
	uint32_t tail = len * lines;
	if (inline_words) {
		const volatile uint32_t *iw = (const volatile uint32_t *)(d + tail);
		if (iw[0] != 0x11111111 || iw[1] != 0x22222222 || iw[2] != 0x33333333)
			bad++;
		tail += 12;
	}
	for (uint32_t j = tail; j < tail + 64; j++)
		if (d[j] != 0xa5)
			bad++;
	if (bad) {
		out("FAIL %s: %u bytes differ", what, bad);
		return 1;
	}
	out("PASS %s: class 0x%04x copied %u KiB GART -> VRAM, then %u lines of %u bytes "
	    "(pitch %u -> %u) VRAM -> GART%s, CPU-checked",
	    what, klass, COPY_BYTES >> 10, lines, len, pin, len,
	    inline_words ? ", plus 12 bytes of inline data" : "");
	return 0;
}

int main(void)
{
	mkdir("/dev", 0755);
	mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
	mkdir("/dev/dri", 0755);
	mknod("/dev/dri/card0", S_IFCHR | 0600, makedev(226, 0));

	int fd = open("/dev/dri/card0", O_RDWR);
	drm_fd = fd;
	if (fd < 0) {
		out("FAIL open /dev/dri/card0: %s", strerror(errno));
		finish(1);
	}
	char name[32] = {0};
	struct drm_version ver;
	memset(&ver, 0, sizeof(ver));
	ver.name = name;
	ver.name_len = sizeof(name) - 1;
	if (ioctl(fd, DRM_IOCTL_VERSION, &ver) == 0)
		out("driver %s %d.%d.%d", name, ver.version_major, ver.version_minor,
		    ver.version_patchlevel);
	uint64_t params[] = {NOUVEAU_GETPARAM_CHIPSET_ID, NOUVEAU_GETPARAM_FB_SIZE,
			     NOUVEAU_GETPARAM_GRAPH_UNITS};
	const char *pname[] = {"chipset", "fb_size", "graph_units"};
	for (int i = 0; i < 3; i++) {
		struct drm_nouveau_getparam gp = {.param = params[i]};
		if (ioctl(fd, DRM_IOCTL_NOUVEAU_GETPARAM, &gp) == 0)
			out("param %s = 0x%llx", pname[i], (unsigned long long)gp.value);
		else
			out("param %s: %s", pname[i], strerror(errno));
	}

	struct drm_nouveau_channel_alloc ch;
	memset(&ch, 0, sizeof(ch));
	if (ioctl(fd, DRM_IOCTL_NOUVEAU_CHANNEL_ALLOC, &ch)) {
		out("FAIL channel alloc: %s", strerror(errno));
		finish(2);
	}
	out("channel %d allocated (pushbuf domains 0x%x)", ch.channel, ch.pushbuf_domains);

	struct drm_nouveau_gem_info vram, gart, push;
	int r;
	if ((r = gem_new(fd, NOUVEAU_GEM_DOMAIN_VRAM, &vram)) ||
	    (r = gem_new(fd, NOUVEAU_GEM_DOMAIN_GART, &gart)) ||
	    (r = gem_new(fd, NOUVEAU_GEM_DOMAIN_GART, &push))) {
		out("FAIL gem new: %s", strerror(-r));
		finish(3);
	}
	out("buffers: vram va 0x%llx, gart va 0x%llx, push va 0x%llx",
	    (unsigned long long)vram.offset, (unsigned long long)gart.offset,
	    (unsigned long long)push.offset);
	volatile uint32_t *g = map_bo(fd, 4096, gart.map_handle);
	uint32_t *p0 = map_bo(fd, 4096, push.map_handle);
	if (g == MAP_FAILED || p0 == MAP_FAILED) {
		out("FAIL mmap: %s", strerror(errno));
		finish(4);
	}
	g[0] = 0;
	uint32_t *p = p0;
	p = sem(p, vram.offset, 0x1234abcd, SEM_RELEASE | SEM_RELEASE_4BYTE);
	p = sem(p, vram.offset, 0x1234abcd, SEM_ACQUIRE_EQ);
	p = sem(p, gart.offset, 0x600dcafe, SEM_RELEASE | SEM_RELEASE_4BYTE);

	struct drm_nouveau_gem_pushbuf_bo bos[3];
	memset(bos, 0, sizeof(bos));
	bos[0].handle = vram.handle;
	bos[0].write_domains = NOUVEAU_GEM_DOMAIN_VRAM;
	bos[0].valid_domains = NOUVEAU_GEM_DOMAIN_VRAM;
	bos[1].handle = gart.handle;
	bos[1].write_domains = NOUVEAU_GEM_DOMAIN_GART;
	bos[1].valid_domains = NOUVEAU_GEM_DOMAIN_GART;
	bos[2].handle = push.handle;
	bos[2].read_domains = NOUVEAU_GEM_DOMAIN_GART;
	bos[2].valid_domains = NOUVEAU_GEM_DOMAIN_GART;
	struct drm_nouveau_gem_pushbuf_push pe = {
		.bo_index = 2, .offset = 0, .length = (uint64_t)((char *)p - (char *)p0)};
	struct drm_nouveau_gem_pushbuf pb;
	memset(&pb, 0, sizeof(pb));
	pb.channel = ch.channel;
	pb.nr_buffers = 3;
	pb.buffers = (uintptr_t)bos;
	pb.nr_push = 1;
	pb.push = (uintptr_t)&pe;
	if (ioctl(fd, DRM_IOCTL_NOUVEAU_GEM_PUSHBUF, &pb)) {
		out("FAIL pushbuf: %s", strerror(errno));
		finish(5);
	}
	out("pushbuf submitted (%llu bytes)", (unsigned long long)pe.length);
	struct drm_nouveau_gem_cpu_prep prep = {.handle = gart.handle, .flags = 0};
	if (ioctl(fd, DRM_IOCTL_NOUVEAU_GEM_CPU_PREP, &prep))
		out("cpu_prep: %s", strerror(errno));
	for (int i = 0; i < 2000 && g[0] != 0x600dcafe; i++)
		usleep(1000);
	int fails = 0;
	if (g[0] == 0x600dcafe) {
		out("PASS semaphores: VRAM release+acquire, GART release read 0x%08x", g[0]);
	} else {
		out("FAIL semaphores: GART word reads 0x%08x", g[0]);
		fails++;
	}
	fails += ttm_move(fd, ch.channel, &gart, g, &push, p0);
	fails += user_copy(fd, ch.channel, 0x9039, "m2mf-copy", &gart, g, &push, p0);
	fails += user_copy(fd, ch.channel, 0x90b5, "ce-copy", &gart, g, &push, p0);
	fails += refused_3d(fd, &gart, g, &push, p0);
	finish(fails ? 6 : 0);
	return 0;
}
