/* cllm eval: not written yet. */
#include "cllm/core.h"
#include "commands.h"

int cmd_eval(int argc, char **argv) {
    (void)argc;
    (void)argv;
    CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "not available yet");
    return tool_fail("eval");
}
