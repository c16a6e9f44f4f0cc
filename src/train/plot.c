/*
 * cllm_train_plot: metrics.jsonl -> one SVG file with two panels sharing
 * the step axis: training loss (line) with evaluation loss (points) on top,
 * learning rate below, and for a mixture of experts (records with
 * "expert_load") a third panel: each expert's share of the step's routed
 * choices (1/E when balanced), up to MAX_EXPERTS experts. A small hand-written SVG writer: axes with "nice"
 * ticks (1, 2, 5 x 10^k), labels and a legend; no scripts, no external
 * resources, so any browser opens it.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/io.h"
#include "cllm/train.h"

typedef struct {
    double *x, *y;
    size_t n, cap;
} series;

enum { MAX_EXPERTS = 16 };
typedef struct {
    series e[MAX_EXPERTS];
    int n; /* experts seen (the first record's count) */
} loads;

static int push(series *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx) return -1;
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny) return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return 0;
}

static void range_of(const series *a, const series *b, bool want_x, double *lo, double *hi) {
    *lo = INFINITY;
    *hi = -INFINITY;
    const series *ss[2] = {a, b};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; ss[k] && i < ss[k]->n; i++) {
            double v = want_x ? ss[k]->x[i] : ss[k]->y[i];
            if (v < *lo) *lo = v;
            if (v > *hi) *hi = v;
        }
    if (!(*lo <= *hi)) *lo = 0, *hi = 1;
    if (*hi - *lo < 1e-12 * fmax(1.0, fabs(*hi))) {
        double pad = fabs(*hi) > 0 ? fabs(*hi) * 0.05 : 1.0;
        *lo -= pad;
        *hi += pad;
    }
}

/* Tick step: 1, 2 or 5 x 10^k giving about `want` intervals. */
static double nice_step(double span, int want) {
    double raw = span / want, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

typedef struct {
    double x0, y0, w, h; /* plot area in px */
    double xlo, xhi, ylo, yhi;
} panel;

static double px(const panel *p, double x) { return p->x0 + (x - p->xlo) / (p->xhi - p->xlo) * p->w; }
static double py(const panel *p, double y) { return p->y0 + p->h - (y - p->ylo) / (p->yhi - p->ylo) * p->h; }

static void axes(FILE *f, const panel *p, const char *title, const char *ylabel) {
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n", p->x0,
            p->y0, p->w, p->h);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" text-anchor=\"middle\">%s</text>\n", p->x0 + p->w / 2,
            p->y0 - 8, title);
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 %.1f "
            "%.1f)\">%s</text>\n",
            p->x0 - 55, p->y0 + p->h / 2, p->x0 - 55, p->y0 + p->h / 2, ylabel);
    double xs = nice_step(p->xhi - p->xlo, 8);
    for (double t = ceil(p->xlo / xs) * xs; t <= p->xhi + xs * 1e-9; t += xs) {
        double X = px(p, t);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", X, p->y0, X, p->y0 + p->h);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n", X,
                p->y0 + p->h + 15, t);
    }
    double ys = nice_step(p->yhi - p->ylo, 5);
    for (double t = ceil(p->ylo / ys) * ys; t <= p->yhi + ys * 1e-9; t += ys) {
        double Y = py(p, t);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", p->x0, Y, p->x0 + p->w, Y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%.3g</text>\n", p->x0 - 5, Y + 4,
                fabs(t) < ys * 1e-6 ? 0.0 : t);
    }
}

static void polyline(FILE *f, const panel *p, const series *s, const char *color) {
    if (s->n == 0) return;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    for (size_t i = 0; i < s->n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", px(p, s->x[i]), py(p, s->y[i]));
    fprintf(f, "\"/>\n");
}

/* One record's expert_load as shares of its sum. */
static int push_loads(loads *ld, double x, const json_t *arr) {
    size_t E = json_array_size(arr);
    if (!E) return 0;
    double sum = 0;
    for (size_t e = 0; e < E; e++) sum += json_number_value(json_array_get(arr, e));
    if (ld->n == 0) ld->n = E < MAX_EXPERTS ? (int)E : MAX_EXPERTS;
    for (int e = 0; e < ld->n && (size_t)e < E && sum > 0; e++)
        if (push(&ld->e[e], x, json_number_value(json_array_get(arr, (size_t)e)) / sum)) return -1;
    return 0;
}

static cllm_status read_series(const char *path, series *loss, series *eval, series *lr, loads *ld) {
    char *text = NULL;
    size_t len = 0;
    cllm_status st = cllm_read_file(path, &text, &len);
    if (st) return st;
    char *line = text;
    size_t lineno = 0;
    while (line < text + len && !st) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
        lineno++;
        if (n > 0) {
            json_t *j = json_loadb(line, n, 0, NULL);
            json_t *step = j ? json_object_get(j, "step") : NULL;
            if (!step || !json_is_number(step)) {
                json_decref(j);
                if (nl) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%zu: not a metrics record", path, lineno);
                break; /* a torn last line is tolerated */
            }
            double x = json_number_value(step);
            json_t *v;
            if ((v = json_object_get(j, "loss")) && json_is_number(v) && push(loss, x, json_number_value(v))) st = CLLM_ERR_NOMEM;
            if ((v = json_object_get(j, "lr")) && json_is_number(v) && push(lr, x, json_number_value(v))) st = CLLM_ERR_NOMEM;
            if ((v = json_object_get(j, "eval_loss")) && json_is_number(v) && push(eval, x, json_number_value(v))) st = CLLM_ERR_NOMEM;
            if ((v = json_object_get(j, "expert_load")) && json_is_array(v) && push_loads(ld, x, v)) st = CLLM_ERR_NOMEM;
            json_decref(j);
        }
        line += n + 1;
    }
    free(text);
    if (st == CLLM_ERR_NOMEM) return CLLM_FAIL(st, "out of memory");
    return st;
}

/* The expert-load panel below the learning rate, a legend at its right. */
static void expert_panel(FILE *f, const loads *ld, double xlo, double xhi) {
    static const char *const colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                         "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    panel p = {80, 640, 740, 160, xlo, xhi, 0, 0};
    double lo = INFINITY, hi = -INFINITY;
    for (int e = 0; e < ld->n; e++) {
        double a, b;
        range_of(&ld->e[e], NULL, false, &a, &b);
        lo = fmin(lo, a), hi = fmax(hi, b);
    }
    p.ylo = fmin(lo, 0.0);
    p.yhi = hi > p.ylo ? hi : p.ylo + 1;
    axes(f, &p, "expert load (share of the routed choices; 1/E balanced)", "share");
    for (int e = 0; e < ld->n; e++) {
        const char *col = colors[e % 10];
        polyline(f, &p, &ld->e[e], col);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"%s\">expert %d</text>\n", p.x0 + p.w + 8,
                p.y0 + 12 + 14 * e, col, e);
    }
}

cllm_status cllm_train_plot(const char *metrics_path, const char *svg_path) {
    series loss = {0}, eval = {0}, lr = {0};
    loads ld = {0};
    cllm_status st = read_series(metrics_path, &loss, &eval, &lr, &ld);
    if (!st && loss.n == 0 && eval.n == 0)
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: no training or evaluation records to plot", metrics_path);
    FILE *f = NULL;
    char *tmp = NULL;
    if (!st) {
        size_t n = strlen(svg_path) + 8;
        tmp = malloc(n);
        if (tmp) snprintf(tmp, n, "%s.tmp", svg_path);
        if (!tmp || !(f = fopen(tmp, "w"))) st = CLLM_FAIL(CLLM_ERR_IO, "cannot write '%s'", svg_path);
    }
    if (!st) {
        const double W = 900, H = ld.n ? 860 : 640;
        panel top = {80, 40, 780, 330, 0, 0, 0, 0}, bot = {80, 440, 780, 150, 0, 0, 0, 0};
        double xlo, xhi;
        range_of(&loss, &eval, true, &xlo, &xhi);
        top.xlo = bot.xlo = xlo;
        top.xhi = bot.xhi = xhi;
        range_of(&loss, &eval, false, &top.ylo, &top.yhi);
        range_of(&lr, NULL, false, &bot.ylo, &bot.yhi);
        fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        fprintf(f,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                W, H, W, H);
        axes(f, &top, "loss", "loss");
        polyline(f, &top, &loss, "#1f77b4");
        for (size_t i = 0; i < eval.n; i++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#d62728\"/>\n", px(&top, eval.x[i]),
                    py(&top, eval.y[i]));
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"58\" x2=\"%.1f\" y2=\"58\" stroke=\"#1f77b4\" stroke-width=\"2\"/>"
                "<text x=\"%.1f\" y=\"62\" font-size=\"12\">train loss</text>\n"
                "<circle cx=\"%.1f\" cy=\"76\" r=\"4\" fill=\"#d62728\"/><text x=\"%.1f\" y=\"80\" "
                "font-size=\"12\">eval loss</text>\n",
                top.x0 + top.w - 130, top.x0 + top.w - 110, top.x0 + top.w - 104, top.x0 + top.w - 120,
                top.x0 + top.w - 104);
        axes(f, &bot, "learning rate", "lr");
        polyline(f, &bot, &lr, "#2ca02c");
        if (ld.n) expert_panel(f, &ld, xlo, xhi);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">step</text>\n",
                bot.x0 + bot.w / 2, H - 25);
        fprintf(f, "</svg>\n");
        if (fclose(f) != 0 || rename(tmp, svg_path) != 0) st = CLLM_FAIL(CLLM_ERR_IO, "cannot write '%s'", svg_path);
        f = NULL;
    }
    if (f) fclose(f);
    if (st && tmp) remove(tmp);
    free(tmp);
    free(loss.x), free(loss.y), free(eval.x), free(eval.y), free(lr.x), free(lr.y);
    for (int e = 0; e < MAX_EXPERTS; e++) free(ld.e[e].x), free(ld.e[e].y);
    return st;
}
