/*
 * The fp16 loss scaler (cllm/loss_scale.h).
 *
 * Without arguments: parameter validation and the static scaler.
 * With arguments it is the driver of tests/loss_scale_test.py, which checks
 * the dynamic sequences against an independent Python version of
 * DeepSpeed's documented algorithm:
 *   test_loss_scale LOSS_SCALE POWER WINDOW HYSTERESIS CONSECUTIVE MIN SEQ
 * SEQ is a string of 0/1 (1 = overflow at that step). One line per step:
 * "<scale used by the step, %.17g> <skip 0/1>", or "error <message>" and
 * exit 0 when the scaler refuses to go lower.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/loss_scale.h"

static int drive(char **argv) {
    cllm_loss_scale_params p = {.loss_scale = strtod(argv[1], NULL),
                                .initial_scale_power = atoi(argv[2]),
                                .window = atol(argv[3]),
                                .hysteresis = atoi(argv[4]),
                                .consecutive = atoi(argv[5]) != 0,
                                .min_scale = strtod(argv[6], NULL)};
    cllm_loss_scaler s;
    if (cllm_loss_scaler_init(&s, p)) {
        printf("error %s\n", cllm_last_error());
        return 0;
    }
    for (const char *c = argv[7]; *c; c++) {
        double used = cllm_loss_scaler_scale(&s);
        bool skip = false;
        if (cllm_loss_scaler_update(&s, *c == '1', &skip)) {
            printf("error %s\n", cllm_last_error());
            return 0;
        }
        printf("%.17g %d\n", used, skip ? 1 : 0);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 8) return drive(argv);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [LOSS_SCALE POWER WINDOW HYSTERESIS CONSECUTIVE MIN SEQ]\n", argv[0]);
        return 2;
    }
    cllm_loss_scale_params ok = {0, 16, 1000, 2, false, 1};
    cllm_loss_scaler s;
    CHECK(cllm_loss_scaler_init(&s, ok) == CLLM_OK, "%s", cllm_last_error());
    CHECK(s.dynamic && cllm_loss_scaler_scale(&s) == 65536.0 && s.cur_hysteresis == 2 && s.last_overflow_iter == -1, "%s", cllm_last_error());
    cllm_loss_scale_params bad = ok;
    bad.window = 0;
    CHECK(cllm_loss_scaler_init(&s, bad) == CLLM_ERR_ARG && strstr(cllm_last_error(), "loss_scale_window"), "%s", cllm_last_error());
    bad = ok;
    bad.hysteresis = 0;
    CHECK(cllm_loss_scaler_init(&s, bad) == CLLM_ERR_ARG && strstr(cllm_last_error(), "hysteresis"), "%s", cllm_last_error());
    bad = ok;
    bad.loss_scale = -1;
    CHECK(cllm_loss_scaler_init(&s, bad) == CLLM_ERR_ARG && strstr(cllm_last_error(), "loss_scale"), "%s", cllm_last_error());
    bad = ok;
    bad.initial_scale_power = 200;
    CHECK(cllm_loss_scaler_init(&s, bad) == CLLM_ERR_ARG && strstr(cllm_last_error(), "initial_scale_power"), "%s", cllm_last_error());
    /* static: the scale never moves, an overflow still skips the step */
    cllm_loss_scale_params st = ok;
    st.loss_scale = 128;
    CHECK(cllm_loss_scaler_init(&s, st) == CLLM_OK && !s.dynamic, "%s", cllm_last_error());
    bool skip = false;
    for (int i = 0; i < 50; i++) {
        CHECK(cllm_loss_scaler_update(&s, i % 3 == 0, &skip) == CLLM_OK, "%s", cllm_last_error());
        CHECK(skip == (i % 3 == 0) && cllm_loss_scaler_scale(&s) == 128.0, "%s", cllm_last_error());
    }
    return check_summary();
}
