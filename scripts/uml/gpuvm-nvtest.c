/*
 * gpuvm-nvtest: the guest program gpuvm's `nouveau` command runs as init inside User-Mode
 * Linux. Written by the gpuvm project. Uses only nouveau's own userspace interface (its DRM
 * ioctls): it reports the device, opens a channel, and has the GPU do semaphore work that can
 * only complete if the channel, nouveau's page tables (shadowed by gpuvm) and both memory
 * kinds work:
 *   1. release 0x1234abcd to a VRAM buffer;
 *   2. acquire on that VRAM word (the channel waits until it equals 0x1234abcd);
 *   3. release 0x600dcafe to a GART (system memory) buffer, which the CPU then reads.
 * VRAM cannot be mapped into a process under UML, so VRAM is checked through the GPU (step 2).
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

static void finish(int code)
{
	out("done (%d)", code);
	sync();
	reboot(RB_POWER_OFF);
	_exit(code);
}

static uint32_t incr(uint32_t mthd, uint32_t count)
{
	/* Fermi incrementing method header, subchannel 0. */
	return 0x20000000u | (count << 16) | (mthd >> 2);
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

static int gem_new(int fd, uint32_t domain, struct drm_nouveau_gem_info *info)
{
	struct drm_nouveau_gem_new req;
	memset(&req, 0, sizeof(req));
	req.info.size = 4096;
	req.info.domain = domain;
	req.align = 4096;
	if (ioctl(fd, DRM_IOCTL_NOUVEAU_GEM_NEW, &req))
		return -errno;
	*info = req.info;
	return 0;
}

int main(void)
{
	mkdir("/dev", 0755);
	mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
	mkdir("/dev/dri", 0755);
	mknod("/dev/dri/card0", S_IFCHR | 0600, makedev(226, 0));

	int fd = open("/dev/dri/card0", O_RDWR);
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
	volatile uint32_t *g = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
				    gart.map_handle);
	uint32_t *p0 = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, push.map_handle);
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
	if (g[0] == 0x600dcafe)
		out("PASS semaphores: VRAM release+acquire, GART release read 0x%08x", g[0]);
	else
		out("FAIL semaphores: GART word reads 0x%08x", g[0]);
	finish(g[0] == 0x600dcafe ? 0 : 6);
	return 0;
}
