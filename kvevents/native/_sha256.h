/* Self-contained SHA-256 (FIPS 180-4) for kvevents.native._speedups: a portable compression function and,
 * on x86-64 CPUs with the SHA extensions, one using them (picked at run time). No OpenSSL needed.
 * Included by _chain.c only: the choice of compression is static state of the file that includes it. */
#ifndef KVEVENTS_SHA256_H
#define KVEVENTS_SHA256_H

#include <stdint.h>
#include <string.h>

static const uint32_t kv_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t kv_H0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

#define KV_ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void kv_compress_portable(uint32_t st[8], const uint8_t *p, size_t blocks) {
    uint32_t w[64];
    while (blocks--) {
        for (int i = 0; i < 16; i++)
            w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) | ((uint32_t)p[4 * i + 2] << 8) |
                   (uint32_t)p[4 * i + 3];
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = KV_ROR(w[i - 15], 7) ^ KV_ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = KV_ROR(w[i - 2], 17) ^ KV_ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], f = st[5], g = st[6], h = st[7];
        for (int i = 0; i < 64; i++) {
            uint32_t S1 = KV_ROR(e, 6) ^ KV_ROR(e, 11) ^ KV_ROR(e, 25);
            uint32_t ch = (e & f) ^ (~e & g);
            uint32_t t1 = h + S1 + ch + kv_K[i] + w[i];
            uint32_t S0 = KV_ROR(a, 2) ^ KV_ROR(a, 13) ^ KV_ROR(a, 22);
            uint32_t mj = (a & b) ^ (a & c) ^ (b & c);
            uint32_t t2 = S0 + mj;
            h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        st[0] += a; st[1] += b; st[2] += c; st[3] += d; st[4] += e; st[5] += f; st[6] += g; st[7] += h;
        p += 64;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(KV_NO_SHANI)
#include <immintrin.h>
#define KV_HAVE_SHANI_CODE 1

/* Rounds four at a time, unrolled: the message schedule in four named 128-bit registers (m0..m3, a
 * ring: group g writes m[g % 4]) so nothing spills, and the state in two (ABEF, CDGH). */
#define KV_RNDS(m)                                                                       \
    do {                                                                                 \
        __m128i k_ = _mm_add_epi32((m), _mm_loadu_si128((const __m128i *)&kv_K[4 * g_])); \
        s1 = _mm_sha256rnds2_epu32(s1, s0, k_);                                          \
        s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(k_, 0x0E));                 \
        g_++;                                                                            \
    } while (0)
/* The next schedule word into `a` (the oldest): from a, b, c, d (oldest to newest). */
#define KV_NEXT(a, b, c, d)                                                              \
    do {                                                                                 \
        (a) = _mm_sha256msg1_epu32((a), (b));                                            \
        (a) = _mm_add_epi32((a), _mm_alignr_epi8((d), (c), 4));                          \
        (a) = _mm_sha256msg2_epu32((a), (d));                                            \
    } while (0)

#define KV_SHANI __attribute__((target("sha,sse4.1,ssse3")))

/* The 64 rounds of one block over the state (ABEF, CDGH), from its four schedule words (big-endian
 * message words, lane i = word i). */
KV_SHANI static inline __attribute__((always_inline)) void kv_shani_block(__m128i *ps0, __m128i *ps1, __m128i m0,
                                                                          __m128i m1, __m128i m2, __m128i m3) {
    __m128i s0 = *ps0, s1 = *ps1, abef = s0, cdgh = s1;
    int g_ = 0;
    KV_RNDS(m0); KV_RNDS(m1); KV_RNDS(m2); KV_RNDS(m3);
    for (int r = 0; r < 3; r++) {  /* groups 4..15, four per turn */
        KV_NEXT(m0, m1, m2, m3); KV_RNDS(m0);
        KV_NEXT(m1, m2, m3, m0); KV_RNDS(m1);
        KV_NEXT(m2, m3, m0, m1); KV_RNDS(m2);
        KV_NEXT(m3, m0, m1, m2); KV_RNDS(m3);
    }
    *ps0 = _mm_add_epi32(s0, abef);
    *ps1 = _mm_add_epi32(s1, cdgh);
}

/* st[0..7] (lane i = word i) <-> the rounds' (ABEF, CDGH) layout. */
KV_SHANI static inline __attribute__((always_inline)) void kv_shani_in(const uint32_t st[8], __m128i *s0, __m128i *s1) {
    __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&st[0]), 0xB1);
    __m128i b = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&st[4]), 0x1B);
    *s0 = _mm_alignr_epi8(tmp, b, 8);
    *s1 = _mm_blend_epi16(b, tmp, 0xF0);
}

KV_SHANI static inline __attribute__((always_inline)) void kv_shani_out(__m128i s0, __m128i s1, __m128i *lo, __m128i *hi) {
    __m128i tmp = _mm_shuffle_epi32(s0, 0x1B);
    s1 = _mm_shuffle_epi32(s1, 0xB1);
    *lo = _mm_blend_epi16(tmp, s1, 0xF0);
    *hi = _mm_alignr_epi8(s1, tmp, 8);
}

KV_SHANI static void kv_compress_shani(uint32_t st[8], const uint8_t *p, size_t blocks) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i s0, s1, lo, hi;
    kv_shani_in(st, &s0, &s1);
    while (blocks--) {
        kv_shani_block(&s0, &s1, _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 0)), bswap),
                       _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16)), bswap),
                       _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 32)), bswap),
                       _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 48)), bswap));
        p += 64;
    }
    kv_shani_out(s0, s1, &lo, &hi);
    _mm_storeu_si128((__m128i *)&st[0], lo);
    _mm_storeu_si128((__m128i *)&st[4], hi);
}

/* One chain link of a 64-byte page (16 tokens) after a digest: out = sha256(prev + page), and prev
 * becomes out. Its two blocks are laid out in registers (the second one's padding is a constant), and
 * the digest goes out in two 16-byte stores the next link loads whole: no byte-by-byte round trip
 * through memory on the chain's critical path. */
KV_SHANI static void kv_link64_shani(uint8_t prev[32], const uint8_t *page, uint8_t out[32]) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i s0, s1, lo, hi;
    kv_shani_in(kv_H0, &s0, &s1);
    kv_shani_block(&s0, &s1, _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)prev), bswap),
                   _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(prev + 16)), bswap),
                   _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)page), bswap),
                   _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(page + 16)), bswap));
    kv_shani_block(&s0, &s1, _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(page + 32)), bswap),
                   _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(page + 48)), bswap),
                   _mm_set_epi32(0, 0, 0, (int)0x80000000u), _mm_set_epi32(96 * 8, 0, 0, 0));
    kv_shani_out(s0, s1, &lo, &hi);
    lo = _mm_shuffle_epi8(lo, bswap);
    hi = _mm_shuffle_epi8(hi, bswap);
    _mm_storeu_si128((__m128i *)out, lo);
    _mm_storeu_si128((__m128i *)(out + 16), hi);
    _mm_storeu_si128((__m128i *)prev, lo);
    _mm_storeu_si128((__m128i *)(prev + 16), hi);
}
/* kv_link64_shani over n consecutive 64-byte pages, the running digest kept in registers as the next
 * page's message words (no byte swap and store and reload between links: they sit on the chain's
 * critical path). Writes each digest to out (32 bytes a page) or, when out is NULL, each digest's
 * published int64 (its first 8 bytes, big-endian, signed) to ints; prev becomes the last digest. */
KV_SHANI static void kv_chain64_shani(uint8_t prev[32], const uint8_t *pages, Py_ssize_t n, uint8_t *out, int64_t *ints) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    const __m128i pad0 = _mm_set_epi32(0, 0, 0, (int)0x80000000u), pad1 = _mm_set_epi32(96 * 8, 0, 0, 0);
    __m128i lo = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)prev), bswap);
    __m128i hi = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(prev + 16)), bswap);
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *page = pages + 64 * i;
        __m128i s0, s1;
        kv_shani_in(kv_H0, &s0, &s1);
        kv_shani_block(&s0, &s1, lo, hi, _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)page), bswap),
                       _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(page + 16)), bswap));
        kv_shani_block(&s0, &s1, _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(page + 32)), bswap),
                       _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(page + 48)), bswap), pad0, pad1);
        kv_shani_out(s0, s1, &lo, &hi); /* the digest's words, in order, as 32-bit lanes */
        if (out) {
            _mm_storeu_si128((__m128i *)(out + 32 * i), _mm_shuffle_epi8(lo, bswap));
            _mm_storeu_si128((__m128i *)(out + 32 * i + 16), _mm_shuffle_epi8(hi, bswap));
        } else {
            ints[i] = (int64_t)(((uint64_t)(uint32_t)_mm_cvtsi128_si32(lo) << 32) |
                                (uint32_t)_mm_extract_epi32(lo, 1));
        }
    }
    _mm_storeu_si128((__m128i *)prev, _mm_shuffle_epi8(lo, bswap));
    _mm_storeu_si128((__m128i *)(prev + 16), _mm_shuffle_epi8(hi, bswap));
}
#undef KV_RNDS
#undef KV_NEXT
#endif

typedef void (*kv_compress_fn)(uint32_t st[8], const uint8_t *p, size_t blocks);
static kv_compress_fn kv_compress = kv_compress_portable;
static const char *kv_sha_impl = "portable";
static int kv_link64_fast = 0; /* kv_link64_shani may be called (SHA-NI picked) */

static void kv_sha256_select(int allow_shani) {
    kv_compress = kv_compress_portable;
    kv_sha_impl = "portable";
    kv_link64_fast = 0;
#ifdef KV_HAVE_SHANI_CODE
    __builtin_cpu_init();
    if (allow_shani && __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1")) {
        kv_compress = kv_compress_shani;
        kv_sha_impl = "sha-ni";
        kv_link64_fast = 1;
    }
#else
    (void)allow_shani;
#endif
}

static inline void kv_digest_out(const uint32_t st[8], uint8_t out[32]) {
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(st[i] >> 24); out[4 * i + 1] = (uint8_t)(st[i] >> 16);
        out[4 * i + 2] = (uint8_t)(st[i] >> 8); out[4 * i + 3] = (uint8_t)st[i];
    }
}

/* SHA-256 of (a, alen) followed by (b, blen), written to out[32]. A message under 120 bytes (a chain
 * link of a 16-token page: 32 + 64) is laid out with its padding in one buffer and compressed in one
 * call: one state load and store instead of one per block (~20 ns a link with SHA-NI). */
static void kv_sha256_2(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen, uint8_t out[32]) {
    uint32_t st[8];
    uint8_t buf[128];
    size_t fill = 0, total = alen + blen;
    memcpy(st, kv_H0, sizeof st);
    if (total < 120) {
        if (alen) memcpy(buf, a, alen);
        if (blen) memcpy(buf + alen, b, blen);
        buf[total] = 0x80;
        size_t padded = total < 56 ? 64 : 128;
        memset(buf + total + 1, 0, padded - total - 1);
        uint64_t bits = (uint64_t)total * 8;
        for (int i = 0; i < 8; i++) buf[padded - 1 - i] = (uint8_t)(bits >> (8 * i));
        kv_compress(st, buf, padded / 64);
        kv_digest_out(st, out);
        return;
    }
    const uint8_t *parts[2] = {a, b};
    size_t lens[2] = {alen, blen};
    for (int j = 0; j < 2; j++) {
        const uint8_t *p = parts[j];
        size_t len = lens[j];
        if (!len) continue;  /* (b may be NULL with blen 0) */
        if (fill) {
            size_t take = 64 - fill < len ? 64 - fill : len;
            memcpy(buf + fill, p, take);
            fill += take; p += take; len -= take;
            if (fill == 64) { kv_compress(st, buf, 1); fill = 0; }
        }
        if (len >= 64) {
            size_t nb = len / 64;
            kv_compress(st, p, nb);
            p += nb * 64; len -= nb * 64;
        }
        if (len) { memcpy(buf + fill, p, len); fill += len; }
    }
    buf[fill++] = 0x80;
    size_t padded = fill <= 56 ? 64 : 128;
    memset(buf + fill, 0, padded - fill);
    uint64_t bits = (uint64_t)total * 8;
    for (int i = 0; i < 8; i++) buf[padded - 1 - i] = (uint8_t)(bits >> (8 * i));
    kv_compress(st, buf, padded / 64);
    kv_digest_out(st, out);
}

#endif
