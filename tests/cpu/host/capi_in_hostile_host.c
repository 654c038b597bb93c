/* The C API inside a host with a hostile C++ runtime (hostile_runtime.c, preloaded): every
 * rejected problem comes back as a status and a message that names the values given, and a plan
 * describes itself, without the library calling into the host's runtime. The problems are the
 * ones that crashed PyTorch and JAX processes: an unsupported head dim, heads that do not divide,
 * a negative scale, and D = 96 on a Hopper device (the Hopper path's refusal is formatted during
 * the automatic choice of path). */
#include <stdio.h>
#include <string.h>

#include "raggedattn/raggedattn.h"

static int failures = 0;

static rattn_problem small_problem(void) {
  rattn_problem p;
  rattn_problem_init(&p);
  p.batch = 2;
  p.total_q = p.total_kv = 300;
  p.max_seqlen_q = p.max_seqlen_kv = 200;
  p.num_heads_q = 4;
  p.num_heads_kv = 2;
  p.head_dim_qk = p.head_dim_v = 128;
  p.dtype = RATTN_DTYPE_BF16;
  p.mask = RATTN_MASK_CAUSAL;
  return p;
}

static void expect_rejected(const char* name, const rattn_problem* p, const rattn_device_caps* caps,
                            const char* fragment) {
  rattn_plan* plan = NULL;
  rattn_status s = rattn_plan_create(p, caps, &plan);
  const char* msg = rattn_last_error();
  if (s == RATTN_SUCCESS || !strstr(msg, fragment)) {
    fprintf(stderr, "FAIL %s: status %s, message '%s', expected a rejection naming '%s'\n", name,
            rattn_status_name(s), msg, fragment);
    failures++;
  } else {
    printf("ok   %s: %s\n", name, msg);
  }
  rattn_plan_destroy(plan);
}

static void expect_planned(const char* name, const rattn_problem* p,
                           const rattn_device_caps* caps) {
  rattn_plan* plan = NULL;
  char text[512];
  rattn_status s = rattn_plan_create(p, caps, &plan);
  if (s == RATTN_SUCCESS) s = rattn_plan_describe(plan, text, sizeof(text));
  if (s != RATTN_SUCCESS) {
    fprintf(stderr, "FAIL %s: %s: %s\n", name, rattn_status_name(s), rattn_last_error());
    failures++;
  } else {
    printf("ok   %s: %s\n", name, text);
  }
  rattn_plan_destroy(plan);
}

int main(void) {
  rattn_device_caps cpu = {0};
  /* An H100's capabilities: make_plan needs no device to choose a path for them. */
  rattn_device_caps hopper = {1, 0, 9, 0, 132, 232448, 50 * 1024 * 1024};
  rattn_problem p = small_problem();
  p.backend = RATTN_BACKEND_CPU;

  p.head_dim_qk = p.head_dim_v = 80;
  expect_rejected("head dim 80", &p, &cpu, "head_dim_qk=80");
  p = small_problem();
  p.backend = RATTN_BACKEND_CPU;
  p.num_heads_q = 6;
  p.num_heads_kv = 4;
  expect_rejected("heads 6/4", &p, &cpu, "num_heads_q=6, num_heads_kv=4");
  p = small_problem();
  p.backend = RATTN_BACKEND_CPU;
  p.softmax_scale = -0.5f;
  expect_rejected("negative scale", &p, &cpu, "softmax_scale=-0.5");
  p = small_problem();
  p.backend = RATTN_BACKEND_CPU;
  p.max_seqlen_q = 1000;
  expect_rejected("max_seqlen over the tokens", &p, &cpu, "max_seqlen_q=1000");

  p = small_problem();
  p.backend = RATTN_BACKEND_CPU;
  expect_planned("cpu plan", &p, &cpu);
  if (rattn_built_with_cuda()) {
    p = small_problem();
    p.head_dim_qk = p.head_dim_v = 96;
    expect_planned("D = 96 on a Hopper device", &p, &hopper);
    p.head_dim_qk = p.head_dim_v = 192;
    expect_planned("D = 192/192 on a Hopper device", &p, &hopper);
    p.backend = RATTN_BACKEND_CUDA_SM90;
    expect_rejected("D = 192/192 forced onto the Hopper path", &p, &hopper, "cuda_sm90 requested");
  }
  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}
