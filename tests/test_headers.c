/* Every public header compiles on its own in strict C11 (this file is built
 * with -std=c11 -pedantic and the project's warnings). */
#include "cllm/core.h"
#include "cllm/cpu.h"
#include "cllm/data.h"
#include "cllm/dist.h"
#include "cllm/generate.h"
#include "cllm/io.h"
#include "cllm/json.h"
#include "cllm/kernels.h"
#include "cllm/launch.h"
#include "cllm/loader.h"
#include "cllm/loss_scale.h"
#include "cllm/memory.h"
#include "cllm/model.h"
#include "cllm/optim.h"
#include "cllm/pipe.h"
#include "cllm/prepare.h"
#include "cllm/sample.h"
#include "cllm/split.h"
#include "cllm/topo.h"

int main(void) { return cllm_dtype_size(CLLM_F32) == 4 ? 0 : 1; }
