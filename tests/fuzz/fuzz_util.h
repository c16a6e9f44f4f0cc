/*
 * Helpers shared by the libFuzzer targets of tests/fuzz/ (one per parser of
 * outside bytes; see docs/reliability.md, "Hostile files"). Each target
 * defines LLVMFuzzerTestOneInput and feeds the input to the public library
 * API: directly where it takes bytes, through files in a private temporary
 * folder where it takes a path.
 */
#ifndef CLLM_FUZZ_UTIL_H
#define CLLM_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Separates the parts of an input that become several files. */
#define FUZZ_SEP "\n--8<--\n"

/* This process's temporary folder (created on first use, removed at exit):
 * in CLLM_FUZZ_TMPDIR when set, else in /dev/shm (memory) where it exists,
 * else in TMPDIR or /tmp. Silences the library's warnings (a fuzzer prints
 * nothing per input). */
const char *fuzz_dir(void);

/* Files per target (slots 0..FUZZ_SLOTS-1). */
#define FUZZ_SLOTS 8

/* Makes fuzz_dir()/name hold len bytes of data and returns its path (valid
 * until the slot's next call); the file the slot held under another name is
 * removed. A slot that already holds these bytes is not written again.
 * Aborts if the write fails: the harness, not the library, is then broken. */
const char *fuzz_write(int slot, const char *name, const void *data, size_t len);

/* As fuzz_write, the file then running on in zero bytes to `size` (a
 * sparse file: large files cost no write). */
const char *fuzz_write_padded(int slot, const char *name, const void *data, size_t len, size_t size);

/* Removes the slot's file, if any (a part the input does not have). */
void fuzz_absent(int slot);

/* Splits data at FUZZ_SEP into at most max parts; returns the count (>= 1).
 * The last part runs to the end of the input. */
int fuzz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len, int max);

/* Returns st; when CLLM_FUZZ_VERBOSE is set in the environment and st is
 * not CLLM_OK, prints the library's message for it (to see why a seed is
 * refused: CLLM_FUZZ_VERBOSE=1 build-fuzz/fuzz/fuzz_X FILE). */
int fuzz_note(int st);
#endif
