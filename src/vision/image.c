/*
 * image.c — photo decoding (stb_image, JPEG and PNG only) and LLaVA-1.5
 * preprocessing. stb_image decodes (through stb_decode.c, its one
 * instance); the file is read here (size-capped), checked, and decoded
 * from memory so that the header can be checked before any pixel buffer
 * is allocated.
 */
#include "vision/image.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"
#include "vision/stb_decode.h"

void ekv_image_free(struct ekv_image *img) {
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
    img->nx = img->ny = 0;
}

/* stb_image (Debian's header, 2.27) builds a JPEG Huffman table with one
 * size entry per code into an array of 257 without checking that the table
 * has at most 256 codes: a hostile file writes past the array (found by
 * tests/fuzz/fuzz_image.c; its corpus keeps the input). Every DHT segment is
 * checked here first, read as stb reads it (tables one after another while
 * the segment's length lasts, bytes past the end read as 0), including the
 * ones between the scans of a progressive JPEG. Returns the first table's
 * code count over 256, or 0 when all are fine (or the data is no JPEG). */
static int jpeg_huffman_excess(const uint8_t *p, size_t n) {
    /* the start-of-image marker as stb reads every marker: 0xFF, any number of
     * 0xFF fill bytes, then 0xD8 (a file opening FF FF D8 escaped the check:
     * found by fuzz_image, 2026-11-28) */
    if (n < 2 || p[0] != 0xFF) return 0;
    size_t i = 1;
    while (i < n && p[i] == 0xFF) i++;
    if (i >= n || p[i] != 0xD8) return 0;
    i++;
    while (i < n) {
        if (p[i] != 0xFF) {
            i++;
            continue;
        }
        while (i < n && p[i] == 0xFF) i++;
        if (i >= n) break;
        const uint8_t m = p[i++];
        if (m == 0xD9) break; /* end of image */
        if (m == 0x00 || m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) continue; /* no length */
        if (i + 2 > n) break;
        const size_t seg = i;
        long len = (long)p[i] << 8 | p[i + 1];
        i += 2;
        if (m == 0xC4) { /* define Huffman tables */
            len -= 2;
            while (len > 0 && i < n) {
                int codes = 0;
                i++; /* class and id */
                for (int k = 0; k < 16; k++, i++) codes += i < n ? p[i] : 0;
                if (codes > 256) return codes;
                i += (size_t)codes;
                len -= 17 + codes;
            }
            continue;
        }
        i = seg + (size_t)(len < 2 ? 2 : len);
        if (m == 0xDA) /* a scan: its entropy-coded bytes up to the next marker */
            while (i + 1 < n && !(p[i] == 0xFF && p[i + 1] != 0x00 && !(p[i + 1] >= 0xD0 && p[i + 1] <= 0xD7))) i++;
    }
    return 0;
}

/* Whether a PNG's first IDAT chunk is empty: stb_image (Debian's header)
 * then offsets its still-NULL data pointer (undefined behaviour, found by
 * fuzz_image). Such files are refused. stb_image handles a chunk once its
 * length and type are read, before its CRC: a file cut inside that CRC
 * counts too (found by fuzz_image again, 2026-11-28). */
static bool png_empty_first_idat(const unsigned char *b, size_t n) {
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    if (n < 8 || memcmp(b, sig, 8) != 0) return false;
    for (size_t at = 8; n - at >= 8;) { /* a chunk's length and type */
        const uint32_t len = (uint32_t)b[at] << 24 | (uint32_t)b[at + 1] << 16 | (uint32_t)b[at + 2] << 8 | b[at + 3];
        if (!memcmp(b + at + 4, "IDAT", 4)) return len == 0;
        if (n - at < 12 || len > n - at - 12) return false;
        at += 12 + (size_t)len;
    }
    return false;
}

/* Files stb_image would mishandle, refused before it reads them. */
static enum ekv_status stb_check(const void *data, size_t n, const char *name) {
    const int codes = jpeg_huffman_excess(data, n);
    if (codes) return ekv_err(EKV_ERR_FORMAT, "%s: corrupt JPEG: a Huffman table of %d codes (at most 256)", name, codes);
    if (png_empty_first_idat(data, n)) return ekv_err(EKV_ERR_FORMAT, "%s: corrupt PNG: an empty first IDAT chunk", name);
    return EKV_OK;
}

/* Bytes of an nx x ny RGB image, with the project's size limits. */
static enum ekv_status image_bytes(const char *name, long long nx, long long ny, size_t *out) {
    if (nx < 1 || ny < 1)
        return ekv_err(EKV_ERR_FORMAT, "%s: image has no pixels (%lld x %lld)", name, nx, ny);
    if (nx > EKV_IMAGE_MAX_SIDE || ny > EKV_IMAGE_MAX_SIDE ||
        (unsigned long long)nx * (unsigned long long)ny > EKV_IMAGE_MAX_PIXELS)
        return ekv_err(EKV_ERR_INVALID_ARG,
                       "%s: image of %lld x %lld pixels is too large (limit %d per side, %u pixels)",
                       name, nx, ny, EKV_IMAGE_MAX_SIDE, (unsigned)EKV_IMAGE_MAX_PIXELS);
    size_t px;
    if (!ekv_mul_ok((size_t)nx, (size_t)ny, &px) || !ekv_mul_ok(px, 3, out))
        return ekv_err(EKV_ERR_OVERFLOW, "%s: image size overflows", name);
    return EKV_OK;
}

enum ekv_status ekv_image_new(int nx, int ny, const uint8_t color[3], struct ekv_image *out) {
    if (!out || !color) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_new: NULL argument");
    out->nx = out->ny = 0;
    out->rgb = NULL;
    size_t n;
    enum ekv_status s = image_bytes("ekv_image_new", nx, ny, &n);
    if (s != EKV_OK) return s;
    uint8_t *p = malloc(n);
    if (!p) return ekv_err(EKV_ERR_NOMEM, "ekv_image_new: %zu bytes", n);
    for (size_t i = 0; i < n; i += 3) {
        p[i] = color[0];
        p[i + 1] = color[1];
        p[i + 2] = color[2];
    }
    out->nx = nx;
    out->ny = ny;
    out->rgb = p;
    return EKV_OK;
}

static uint32_t be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t be32(const uint8_t *p) { return be16(p) << 16 | be16(p + 2); }

/* Width and height as a PNG (IHDR) or JPEG (SOFn segment) header claims
 * them; false when neither header can be read. */
static bool sniff_size(const uint8_t *p, size_t n, long long *w, long long *h) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 24 && memcmp(p, png_sig, 8) == 0 && memcmp(p + 12, "IHDR", 4) == 0) {
        *w = be32(p + 16);
        *h = be32(p + 20);
        return true;
    }
    if (n < 4 || p[0] != 0xff || p[1] != 0xd8) return false;
    size_t i = 2;
    while (i + 4 <= n) {
        if (p[i] != 0xff) return false;
        uint8_t m = p[i + 1];
        if (m == 0xff) { i++; continue; }                       /* fill byte */
        if (m == 0xd8 || m == 0x01 || (m >= 0xd0 && m <= 0xd7)) { i += 2; continue; }
        if (m == 0xd9 || m == 0xda) return false;              /* end or scan before a frame */
        size_t len = be16(p + i + 2);
        bool sof = m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc;
        if (sof) {
            if (i + 9 > n) return false;
            *h = be16(p + i + 5);
            *w = be16(p + i + 7);
            return true;
        }
        if (len < 2) return false;
        i += 2 + len;
    }
    return false;
}

enum ekv_status ekv_image_load_memory(const void *data, size_t n, const char *name,
                                      struct ekv_image *out) {
    if (!out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_load_memory: NULL output");
    out->nx = out->ny = 0;
    out->rgb = NULL;
    if (!name) name = "(image in memory)";
    if (!data || n == 0) return ekv_err(EKV_ERR_FORMAT, "%s: empty image data", name);
    if (n > (size_t)INT_MAX || n > EKV_IMAGE_MAX_FILE_BYTES)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: image file of %zu bytes is too large", name, n);
    /* The size limit is checked on the header first, so that an absurd
     * claimed size is reported as such (stb_image only says it cannot
     * read the file). */
    long long hw, hh;
    size_t bytes;
    enum ekv_status s;
    if (sniff_size(data, n, &hw, &hh) && (s = image_bytes(name, hw, hh, &bytes)) != EKV_OK)
        return s;
    if ((s = stb_check(data, n, name)) != EKV_OK) return s;
    int w = 0, h = 0, comp = 0;
    if (!ekv_stb_info(data, (int)n, &w, &h, &comp))
        return ekv_err(EKV_ERR_FORMAT, "%s: not a readable JPEG or PNG image (%s)", name,
                       ekv_stb_failure() ? ekv_stb_failure() : "unknown");
    if ((s = image_bytes(name, w, h, &bytes)) != EKV_OK) return s;
    int w2 = 0, h2 = 0, c2 = 0;
    unsigned char *px = ekv_stb_load(data, (int)n, &w2, &h2, &c2, 3);
    if (!px)
        return ekv_err(EKV_ERR_FORMAT, "%s: cannot decode image (%s)", name,
                       ekv_stb_failure() ? ekv_stb_failure() : "unknown");
    if (w2 != w || h2 != h) {
        ekv_stb_free(px);
        return ekv_err(EKV_ERR_FORMAT, "%s: decoded size %dx%d differs from header %dx%d", name, w2,
                       h2, w, h);
    }
    /* Copy into malloc'd memory so that ekv_image_free is plain free(). */
    uint8_t *rgb = malloc(bytes);
    if (!rgb) {
        ekv_stb_free(px);
        return ekv_err(EKV_ERR_NOMEM, "%s: %zu bytes for pixels", name, bytes);
    }
    memcpy(rgb, px, bytes);
    ekv_stb_free(px);
    out->nx = w;
    out->ny = h;
    out->rgb = rgb;
    return EKV_OK;
}

enum ekv_status ekv_image_probe_memory(const void *data, size_t n, const char *name, int *nx, int *ny) {
    if (!nx || !ny) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_probe_memory: NULL output");
    *nx = *ny = 0;
    if (!name) name = "(image in memory)";
    if (!data || n == 0) return ekv_err(EKV_ERR_FORMAT, "%s: empty image data", name);
    if (n > (size_t)INT_MAX || n > EKV_IMAGE_MAX_FILE_BYTES)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: image file of %zu bytes is too large", name, n);
    long long hw, hh;
    size_t bytes;
    enum ekv_status s;
    if (sniff_size(data, n, &hw, &hh) && (s = image_bytes(name, hw, hh, &bytes)) != EKV_OK) return s;
    if ((s = stb_check(data, n, name)) != EKV_OK) return s;
    int w = 0, h = 0, comp = 0;
    if (!ekv_stb_info(data, (int)n, &w, &h, &comp))
        return ekv_err(EKV_ERR_FORMAT, "%s: not a readable JPEG or PNG image (%s)", name,
                       ekv_stb_failure() ? ekv_stb_failure() : "unknown");
    if ((s = image_bytes(name, w, h, &bytes)) != EKV_OK) return s;
    *nx = w;
    *ny = h;
    return EKV_OK;
}

/* The whole file into a malloc'd buffer, with the size limits checked. */
static enum ekv_status read_image_file(const char *path, unsigned char **out, size_t *n) {
    *out = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return ekv_err(EKV_ERR_IO, "%s: cannot open image: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return ekv_err(EKV_ERR_IO, "%s: not a regular file", path);
    }
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return ekv_err(EKV_ERR_IO, "%s: cannot determine the file size", path);
    }
    if ((unsigned long)size > EKV_IMAGE_MAX_FILE_BYTES) {
        fclose(f);
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: image file of %ld bytes is too large (limit %zu)",
                       path, size, (size_t)EKV_IMAGE_MAX_FILE_BYTES);
    }
    if (size == 0) {
        fclose(f);
        return ekv_err(EKV_ERR_FORMAT, "%s: empty file", path);
    }
    unsigned char *buf = malloc((size_t)size);
    if (!buf) {
        fclose(f);
        return ekv_err(EKV_ERR_NOMEM, "%s: %ld bytes", path, size);
    }
    size_t got = fread(buf, 1, (size_t)size, f);
    int rerr = ferror(f);
    fclose(f);
    if (got != (size_t)size || rerr) {
        free(buf);
        return ekv_err(EKV_ERR_IO, "%s: read %zu of %ld bytes", path, got, size);
    }
    *out = buf;
    *n = (size_t)size;
    return EKV_OK;
}

enum ekv_status ekv_image_load_file(const char *path, struct ekv_image *out) {
    if (!out || !path) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_load_file: NULL argument");
    out->nx = out->ny = 0;
    out->rgb = NULL;
    unsigned char *buf;
    size_t n;
    enum ekv_status s = read_image_file(path, &buf, &n);
    if (s != EKV_OK) return s;
    s = ekv_image_load_memory(buf, n, path, out);
    free(buf);
    return s;
}

enum ekv_status ekv_image_probe_file(const char *path, int *nx, int *ny) {
    if (!path || !nx || !ny) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_probe_file: NULL argument");
    *nx = *ny = 0;
    unsigned char *buf;
    size_t n;
    enum ekv_status s = read_image_file(path, &buf, &n);
    if (s != EKV_OK) return s;
    s = ekv_image_probe_memory(buf, n, path, nx, ny);
    free(buf);
    return s;
}

enum ekv_status ekv_image_pad_square(const struct ekv_image *src, const uint8_t color[3],
                                     struct ekv_image *out) {
    if (!src || !src->rgb || !out || !color)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_pad_square: NULL argument");
    int side = EKV_MAX(src->nx, src->ny);
    enum ekv_status s = ekv_image_new(side, side, color, out);
    if (s != EKV_OK) return s;
    int ox = (side - src->nx) / 2, oy = (side - src->ny) / 2;
    size_t row = (size_t)src->nx * 3;
    for (int y = 0; y < src->ny; y++)
        memcpy(out->rgb + ((size_t)(y + oy) * (size_t)side + (size_t)ox) * 3,
               src->rgb + (size_t)y * row, row);
    return EKV_OK;
}

/* Resampling as Pillow's Image.resize(BICUBIC) does it, which is what the
 * Hugging Face image processors of LLaVA call and what llama.cpp's mtmd
 * reproduces: each output pixel is a weighted sum over the input pixels
 * under a cubic kernel (a = -0.5) centred on the output pixel's centre
 * mapped into the input, widened by the scale when shrinking (so a large
 * photo is low-pass filtered instead of point-sampled), weights normalised
 * to sum 1 and held in 22-bit fixed point; rows first, then columns, each
 * pass rounded to 8 bits. */
#define RS_BITS 22

static double rs_cubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

/* Pillow's LANCZOS: sinc(x) sinc(x/3) on [-3, 3) (what Idefics3/SmolVLM's
 * processor asks PIL for). */
static double rs_sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= 3.14159265358979323846;
    return sin(x) / x;
}

static double rs_lanczos(double x) { return -3.0 <= x && x < 3.0 ? rs_sinc(x) * rs_sinc(x / 3.0) : 0.0; }

static double rs_filter(enum ekv_resample f, double x) { return f == EKV_RESAMPLE_LANCZOS ? rs_lanczos(x) : rs_cubic(x); }

/* Weights of one pass, in -> out pixels: taps [out][ksize] in fixed point,
 * first[out] and count[out] the input span each output pixel reads. */
struct rs_pass {
    int ksize;
    int *first, *count;
    int32_t *taps;
};

static void rs_pass_free(struct rs_pass *p) {
    free(p->first), free(p->count), free(p->taps);
    p->first = p->count = NULL, p->taps = NULL;
}

static enum ekv_status rs_pass_init(enum ekv_resample f, int in, int out, struct rs_pass *p) {
    const double scale = (double)in / (double)out, fscale = scale < 1.0 ? 1.0 : scale;
    const double support = (f == EKV_RESAMPLE_LANCZOS ? 3.0 : 2.0) * fscale;
    p->ksize = (int)ceil(support) * 2 + 1;
    p->first = malloc((size_t)out * sizeof *p->first);
    p->count = malloc((size_t)out * sizeof *p->count);
    p->taps = malloc((size_t)out * (size_t)p->ksize * sizeof *p->taps);
    double *w = malloc((size_t)p->ksize * sizeof *w);
    if (!p->first || !p->count || !p->taps || !w) {
        free(w);
        rs_pass_free(p);
        return ekv_err(EKV_ERR_NOMEM, "image resize: %d taps for %d pixels", p->ksize, out);
    }
    for (int o = 0; o < out; o++) {
        const double centre = ((double)o + 0.5) * scale;
        const int lo = EKV_MAX((int)(centre - support + 0.5), 0), hi = EKV_MIN((int)(centre + support + 0.5), in);
        const int n = hi - lo;
        double sum = 0.0;
        for (int k = 0; k < n; k++) sum += w[k] = rs_filter(f, ((double)(k + lo) - centre + 0.5) / fscale);
        int32_t *t = p->taps + (size_t)o * (size_t)p->ksize;
        for (int k = 0; k < p->ksize; k++) {
            const double v = k < n && sum != 0.0 ? w[k] / sum * (double)(1 << RS_BITS) : 0.0;
            t[k] = (int32_t)(v < 0.0 ? v - 0.5 : v + 0.5);
        }
        p->first[o] = lo, p->count[o] = n;
    }
    free(w);
    return EKV_OK;
}

static uint8_t rs_round8(int32_t acc) {
    if (acc < 0) return 0; /* the sum started at half a step, so this rounds to nearest */
    return (uint8_t)EKV_MIN(acc >> RS_BITS, 255);
}

/* One pass along x (stride 3 between taps) or along y (stride a row):
 * dst [ny][nx] from src, whose pixel o along the pass axis reads p's taps. */
static void rs_apply(const struct rs_pass *p, const uint8_t *src, int src_nx, uint8_t *dst, int nx, int ny, bool along_x) {
    const size_t tap_step = along_x ? 3 : (size_t)src_nx * 3;
    for (int y = 0; y < ny; y++)
        for (int x = 0; x < nx; x++) {
            const int o = along_x ? x : y;
            const int32_t *t = p->taps + (size_t)o * (size_t)p->ksize;
            const uint8_t *s0 = along_x ? src + ((size_t)y * (size_t)src_nx + (size_t)p->first[o]) * 3
                                        : src + ((size_t)p->first[o] * (size_t)src_nx + (size_t)x) * 3;
            for (int c = 0; c < 3; c++) {
                int32_t acc = 1 << (RS_BITS - 1);
                for (int k = 0; k < p->count[o]; k++) acc += (int32_t)s0[(size_t)k * tap_step + (size_t)c] * t[k];
                dst[((size_t)y * (size_t)nx + (size_t)x) * 3 + (size_t)c] = rs_round8(acc);
            }
        }
}

enum ekv_status ekv_image_resize_bicubic(const struct ekv_image *src, int nx, int ny,
                                         struct ekv_image *out) {
    return ekv_image_resize(src, nx, ny, EKV_RESAMPLE_BICUBIC, out);
}

enum ekv_status ekv_image_resize(const struct ekv_image *src, int nx, int ny, enum ekv_resample f,
                                 struct ekv_image *out) {
    if (!src || !src->rgb || !out)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_resize: NULL argument");
    static const uint8_t black[3] = {0, 0, 0};
    struct ekv_image mid = {0};
    struct rs_pass px = {0}, py = {0};
    enum ekv_status s = ekv_image_new(nx, ny, black, out);
    if (s != EKV_OK) return s;
    const bool do_x = nx != src->nx, do_y = ny != src->ny;
    /* a pass whose size does not change is skipped, as Pillow does (it would be the identity) */
    if (!do_x && !do_y) {
        memcpy(out->rgb, src->rgb, (size_t)nx * (size_t)ny * 3);
        return EKV_OK;
    }
    if (do_x && (s = rs_pass_init(f, src->nx, nx, &px)) == EKV_OK) {
        if (!do_y) {
            rs_apply(&px, src->rgb, src->nx, out->rgb, nx, ny, true);
        } else if ((s = ekv_image_new(nx, src->ny, black, &mid)) == EKV_OK) {
            rs_apply(&px, src->rgb, src->nx, mid.rgb, nx, src->ny, true);
        }
    }
    if (s == EKV_OK && do_y && (s = rs_pass_init(f, src->ny, ny, &py)) == EKV_OK) {
        const struct ekv_image *in = do_x ? &mid : src;
        rs_apply(&py, in->rgb, nx, out->rgb, nx, ny, false);
    }
    rs_pass_free(&px);
    rs_pass_free(&py);
    ekv_image_free(&mid);
    if (s != EKV_OK) ekv_image_free(out);
    return s;
}

enum ekv_status ekv_image_crop(const struct ekv_image *src, int x0, int y0, int nx, int ny, struct ekv_image *out) {
    if (!src || !src->rgb || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_crop: NULL argument");
    if (x0 < 0 || y0 < 0 || nx < 1 || ny < 1 || x0 > src->nx - nx || y0 > src->ny - ny)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_crop: %dx%d at (%d, %d) is outside the %dx%d image", nx, ny, x0,
                       y0, src->nx, src->ny);
    static const uint8_t black[3] = {0, 0, 0};
    enum ekv_status s = ekv_image_new(nx, ny, black, out);
    if (s != EKV_OK) return s;
    for (int y = 0; y < ny; y++)
        memcpy(out->rgb + (size_t)y * (size_t)nx * 3, src->rgb + ((size_t)(y0 + y) * (size_t)src->nx + (size_t)x0) * 3,
               (size_t)nx * 3);
    return EKV_OK;
}

void ekv_image_normalize(const struct ekv_image *src, const float mean[3], const float std[3],
                         float *out) {
    const size_t n = (size_t)src->nx * (size_t)src->ny;
    for (int c = 0; c < 3; c++) {
        float *dst = out + (size_t)c * n;
        for (size_t i = 0; i < n; i++)
            dst[i] = ((float)src->rgb[i * 3 + (size_t)c] / 255.0f - mean[c]) / std[c];
    }
}

void ekv_image_mean_color(const float mean[3], uint8_t color[3]) {
    for (int c = 0; c < 3; c++) {
        float v = mean[c] * 255.0f;
        color[c] = (uint8_t)(v <= 0.0f ? 0 : (v >= 255.0f ? 255 : (int)v));
    }
}

enum ekv_status ekv_image_preprocess_llava(const struct ekv_image *src, int size,
                                           const float mean[3], const float std[3], float *out) {
    if (!src || !src->rgb || !mean || !std || !out)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_preprocess_llava: NULL argument");
    if (size < 1 || size > EKV_IMAGE_MAX_SIDE)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_image_preprocess_llava: bad size %d", size);
    for (int c = 0; c < 3; c++)
        if (!(std[c] > 0.0f) || !isfinite(mean[c]))
            return ekv_err(EKV_ERR_INVALID_ARG,
                           "ekv_image_preprocess_llava: channel %d has mean %g, std %g", c,
                           (double)mean[c], (double)std[c]);
    uint8_t color[3];
    ekv_image_mean_color(mean, color);
    struct ekv_image sq = {0}, rs = {0};
    enum ekv_status s = ekv_image_pad_square(src, color, &sq);
    if (s == EKV_OK) s = ekv_image_resize_bicubic(&sq, size, size, &rs);
    if (s == EKV_OK) ekv_image_normalize(&rs, mean, std, out);
    ekv_image_free(&sq);
    ekv_image_free(&rs);
    return s;
}
