/* The bulk loop of dt_symm_mem.ntcopy, kept here as the source of the machine code
   embedded there. Regenerate and check the bytes with `python tools/build_nt_copy.py`.

   Copies n bytes (a multiple of 64) from src to dst (16-byte aligned) with SSE2
   non-temporal stores, then sfence so the stores are ordered before any later flag
   store. It calls nothing and uses no data, so its machine code is position-independent. */
#include <emmintrin.h>
#include <stddef.h>

void nt_copy_bulk(void *dst, const void *src, size_t n) {
    __m128i *d = (__m128i *)dst;
    const __m128i *s = (const __m128i *)src;
    for (size_t i = 0; i < n / 16; i += 4) {
        __m128i a = _mm_loadu_si128(s + i);
        __m128i b = _mm_loadu_si128(s + i + 1);
        __m128i c = _mm_loadu_si128(s + i + 2);
        __m128i e = _mm_loadu_si128(s + i + 3);
        _mm_stream_si128(d + i, a);
        _mm_stream_si128(d + i + 1, b);
        _mm_stream_si128(d + i + 2, c);
        _mm_stream_si128(d + i + 3, e);
    }
    _mm_sfence();
}
