/*
 * cllm launch's parsing (cllm/launch.h): DeepSpeed hostfiles, include /
 * exclude filters with DeepSpeed's rules, -n limits and .cllm_env files,
 * including every error message's FILE:LINE or offending part. The expected
 * selections are written out by hand from DeepSpeed's documented semantics.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/launch.h"

/* "host:0,1 host2:3" for the current selection */
static void render(const cllm_launch_hosts *h, char *buf, size_t len) {
    buf[0] = '\0';
    size_t o = 0;
    for (int i = 0; i < h->n && o < len; i++) {
        o += (size_t)snprintf(buf + o, len - o, "%s%s:", i ? " " : "", h->hosts[i].name);
        for (int k = 0; k < h->hosts[i].n_sel && o < len; k++)
            o += (size_t)snprintf(buf + o, len - o, "%s%d", k ? "," : "", h->hosts[i].sel[k]);
    }
}

static const char *HOSTFILE =
    "# two workers\n"
    "worker-0 slots=4\n"
    "\n"
    "   worker-1\tslots=2   # trailing comment\n"
    "worker-2 slots=1\n";

/* Parses HOSTFILE, applies the filter, checks the rendering (NULL: expect
 * failure with `err` in the message). */
static void filt(const char *inc, const char *exc, const char *want, const char *err) {
    cllm_launch_hosts h;
    cllm_status st = cllm_launch_hostfile_parse(HOSTFILE, "hf", &h);
    CHECK(st == CLLM_OK, "%s", cllm_last_error());
    st = cllm_launch_hosts_filter(&h, inc, exc);
    char got[256];
    render(&h, got, sizeof got);
    if (want) {
        CHECK(st == CLLM_OK, "include %s exclude %s: %s", inc, exc, cllm_last_error());
        CHECK(strcmp(got, want) == 0, "include %s exclude %s: got '%s', want '%s'", inc, exc, got, want);
    } else {
        CHECK(st != CLLM_OK, "include %s exclude %s: accepted (%s)", inc, exc, got);
        CHECK(strstr(cllm_last_error(), err), "include %s exclude %s: message '%s' lacks '%s'", inc, exc,
              cllm_last_error(), err);
        /* a failed filter leaves the hosts untouched */
        CHECK(strcmp(got, "worker-0:0,1,2,3 worker-1:0,1 worker-2:0") == 0, "changed by a failed filter: %s", got);
    }
    cllm_launch_hosts_free(&h);
}

static void bad_hostfile(const char *text, const char *err) {
    cllm_launch_hosts h;
    CHECK(cllm_launch_hostfile_parse(text, "hosts.txt", &h) != CLLM_OK, "accepted: %s", text);
    CHECK(strstr(cllm_last_error(), err), "'%s': message '%s' lacks '%s'", text, cllm_last_error(), err);
    CHECK(h.n == 0 && h.hosts == NULL, "output not empty after a failure");
}

static void bad_env(const char *text, const char *err) {
    char **kv;
    int n;
    CHECK(cllm_launch_env_parse(text, ".cllm_env", &kv, &n) != CLLM_OK, "accepted: %s", text);
    CHECK(strstr(cllm_last_error(), err), "'%s': message '%s' lacks '%s'", text, cllm_last_error(), err);
}

int main(void) {
    char got[256];
    cllm_launch_hosts h;
    CHECK(cllm_launch_hostfile_parse(HOSTFILE, "hf", &h) == CLLM_OK, "%s", cllm_last_error());
    render(&h, got, sizeof got);
    CHECK(strcmp(got, "worker-0:0,1,2,3 worker-1:0,1 worker-2:0") == 0, "parsed %s", got);
    CHECK(cllm_launch_hosts_count(&h) == 7, "count %d", cllm_launch_hosts_count(&h));
    CHECK(h.n == 3 && h.hosts[1].slots == 2, "slots");
    /* -n takes slots host by host in hostfile order */
    CHECK(cllm_launch_hosts_limit(&h, 5) == CLLM_OK, "%s", cllm_last_error());
    render(&h, got, sizeof got);
    CHECK(strcmp(got, "worker-0:0,1,2,3 worker-1:0") == 0, "limit 5: %s", got);
    CHECK(cllm_launch_hosts_limit(&h, 6) != CLLM_OK && strstr(cllm_last_error(), "6 ranks requested, but the hosts offer 5 slots"),
          "limit 6: %s", cllm_last_error());
    cllm_launch_hosts_free(&h);
    cllm_launch_hosts_free(&h); /* twice is fine */

    /* include: bare hosts keep all their slots, slot lists keep those slots */
    filt("worker-1", NULL, "worker-1:0,1", NULL);
    filt("worker-0:0,2@worker-2", NULL, "worker-0:0,2 worker-2:0", NULL);
    filt("worker-2@worker-0:3", NULL, "worker-0:3 worker-2:0", NULL); /* hostfile order */
    filt("worker-0:2,0,2", NULL, "worker-0:0,2", NULL);                 /* sorted, once */
    filt("worker-0:1@worker-0:3", NULL, "worker-0:1,3", NULL);
    /* exclude: bare hosts go away, slot lists remove those slots */
    filt(NULL, "worker-1", "worker-0:0,1,2,3 worker-2:0", NULL);
    filt(NULL, "worker-0:1,3@worker-2", "worker-0:0,2 worker-1:0,1", NULL);
    filt(NULL, "worker-2:0", "worker-0:0,1,2,3 worker-1:0,1", NULL); /* no slot left: host dropped */
    filt("", "", "worker-0:0,1,2,3 worker-1:0,1 worker-2:0", NULL);
    /* errors */
    filt("worker-0", "worker-1", NULL, "mutually exclusive");
    filt("worker-9", NULL, NULL, "--include 'worker-9': host 'worker-9' is not in the hostfile");
    filt(NULL, "worker-1:2", NULL, "--exclude 'worker-1:2': host 'worker-1' has no slot 2 (slots=2: 0..1)");
    filt("worker-0:x", NULL, NULL, "slot 'x' of host 'worker-0' is not a slot number");
    filt("worker-0:", NULL, NULL, "slot '' of host 'worker-0'");
    filt("worker-0:1,", NULL, NULL, "slot '' of host 'worker-0'");
    filt("worker-0@@worker-1", NULL, NULL, "empty host name");
    filt(":1", NULL, NULL, "empty host name");
    filt("worker-0@worker-0:1", NULL, NULL, "both with and without slots");
    filt(NULL, "worker-0@worker-1@worker-2", NULL, "leaves no slot to run on");

    /* hostfile errors name FILE:LINE */
    bad_hostfile("a slots=2\nb\n", "hosts.txt:2: expected 'HOST slots=N', got 'b'");
    bad_hostfile("a slots=2\n\n# c\nb slots=0\n", "hosts.txt:4: slots must be an integer in 1..65536, got '0'");
    bad_hostfile("a slots=-1\n", "hosts.txt:1: slots must be");
    bad_hostfile("a slots=2x\n", "hosts.txt:1: slots must be");
    bad_hostfile("a slots=99999999999\n", "hosts.txt:1: slots must be");
    bad_hostfile("a gpus=2\n", "hosts.txt:1: expected 'HOST slots=N'");
    bad_hostfile("a slots=1\nb slots=1\na slots=3\n", "hosts.txt:3: host 'a' is listed twice");
    bad_hostfile("a:1 slots=1\n", "hosts.txt:1: host name 'a:1' contains");
    bad_hostfile("# only a comment\n\n", "hosts.txt: no hosts");
    bad_hostfile("", "hosts.txt: no hosts");
    /* CRLF line ends and a missing final newline are fine */
    CHECK(cllm_launch_hostfile_parse("a slots=1\r\nb slots=2", "crlf", &h) == CLLM_OK && h.n == 2 && h.hosts[1].slots == 2,
          "crlf: %s", cllm_last_error());
    cllm_launch_hosts_free(&h);
    CHECK(cllm_launch_hosts_single("localhost", 3, &h) == CLLM_OK && cllm_launch_hosts_count(&h) == 3, "single");
    cllm_launch_hosts_free(&h);
    CHECK(cllm_launch_hosts_single("localhost", 0, &h) != CLLM_OK, "0 ranks accepted");

    /* environment files */
    char **kv;
    int n;
    CHECK(cllm_launch_env_parse("# comment\nA=1\n\n  B_2 = x=y z \nEMPTY=\n", "e", &kv, &n) == CLLM_OK, "%s", cllm_last_error());
    CHECK(n == 3 && strcmp(kv[0], "A=1") == 0 && strcmp(kv[1], "B_2=x=y z") == 0 && strcmp(kv[2], "EMPTY=") == 0,
          "env parsed wrong (%d entries)", n);
    cllm_launch_env_free(kv, n);
    bad_env("A=1\nnot a line\n", ".cllm_env:2: expected KEY=VALUE");
    bad_env("1A=2\n", ".cllm_env:1: expected KEY=VALUE");
    bad_env("=2\n", ".cllm_env:1:");
    bad_env("A B=2\n", ".cllm_env:1:");
    return check_summary();
}
