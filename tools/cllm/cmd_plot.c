/*
 * cllm plot RUN_DIR: draws RUN_DIR/metrics.jsonl (training loss, eval loss
 * points, learning rate) into RUN_DIR/plot.svg (or --out FILE).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cllm/train.h"
#include "commands.h"

int cmd_plot(int argc, char **argv) {
    if (argc < 1 || strncmp(argv[0], "--", 2) == 0) {
        if (argc >= 1 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) {
            printf("usage: cllm plot RUN_DIR [--out FILE.svg]\n\nWrites the loss and learning-rate curves of "
                   "RUN_DIR/metrics.jsonl as SVG (default RUN_DIR/plot.svg).\n");
            return 0;
        }
        fprintf(stderr, "cllm plot: usage: cllm plot RUN_DIR [--out FILE.svg]\n");
        return 2;
    }
    const char *dir = argv[0], *out;
    arg_spec specs[] = {{"out", ARG_STR, &out, NULL, false, "SVG file to write (default RUN_DIR/plot.svg)"}};
    int rc = args_parse("plot", "Plots loss and learning rate of a training run as SVG.", argc - 1, argv + 1, specs,
                        ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    size_t n = strlen(dir) + 32;
    char *metrics = malloc(n), *svg = malloc(n);
    if (!metrics || !svg) {
        free(metrics);
        free(svg);
        return 1;
    }
    snprintf(metrics, n, "%s/metrics.jsonl", dir);
    snprintf(svg, n, "%s/plot.svg", dir);
    if (cllm_train_plot(metrics, out ? out : svg)) {
        rc = tool_fail("plot");
    } else {
        printf("%s\n", out ? out : svg);
    }
    free(metrics);
    free(svg);
    return rc;
}
