# tests/cuda/emu_trainer.cmake -- included by tests/cuda/CMakeLists.txt where
# parcrt_cuda_emu (runtime/cuda on the CPU emulation of CUDA) is built: the
# generated GPU trainers run on the CPU against the CPU trainer
# (trainer_emu.py says what each check proves).  Mirrors tests/gpu/check.sh's
# steps 2, 2g, 3, 3b, 3c and 3d at 4 steps.
#
#   cuda/emu_trainer/NAME     NAME's checks (cpu: losses and, at one rank, step-1
#                             gradients against train at 1e-4; graph: a captured
#                             step replayed, bits equal to plain launches;
#                             device: device-local collectives, bits equal to
#                             host-staged; bf16: bf16 GEMMs and tensor-core
#                             attention: losses 2e-4, gradients 3e-2 of train;
#                             store: -D precision=bf16 (activations stored as
#                             bf16) = --bf16-store round bit for bit, and
#                             within the bf16 check's bounds of train;
#                             launch: a too-small GPU refused at start-up with
#                             planned and free bytes, a cudaMalloc failing after
#                             that check with the bytes asked and free, exit 1,
#                             no step run (threads and mpirun, every process
#                             finalising MPI); mpirun's losses = the threads'; grads:
#                             the step-1 gradients at several ranks too; batch:
#                             --no-batch = the batched trainer bit for bit, with
#                             steps x the absorbed launches more launches;
#                             bgrad: the bias sums in their GEMMs' epilogue against
#                             their kernels after the GEMMs (no epilogue, or
#                             PARC_CUDA_BGRAD=0: the same bits), train at 1e-4;
#                             layout: --head-major-attn = the token-major
#                             attention bit for bit, with more launches;
#                             recompute: bf16 --recompute norms near the
#                             store check's run, with a smaller GPU arena;
#                             pointwise: bf16 --recompute pointwise near the
#                             store check's run, with a smaller GPU arena;
#                             layers: bf16 --recompute layers likewise;
#                             tune: PARC_CUDA_GEMM_TUNE=FILE timing emulated
#                             algorithms near train, a second run reading FILE
#                             the same bits)
# libparcrt and what it links (runtime/CMakeLists.txt: cJSON, OpenBLAS, MPI where found)
find_package(MPI COMPONENTS C QUIET)
set(emu_link $<TARGET_FILE:parcrt> ${CJSON_LIB} ${OPENBLAS_LIB})
if(MPI_C_FOUND)
  list(APPEND emu_link ${MPI_C_LIBRARIES})
endif()
list(APPEND emu_link -lpthread -lm)
string(JOIN " " emu_link ${emu_link})
# NAME|MODEL|PARC ARGS|CHECKS|GRAPH NOTICES
set(emu_cases
  "gpt2_tiny|gpt2_tiny||cpu,graph,bf16,store,launch,batch,layout,recompute,pointwise,layers,bgrad,tune|0"
  "llama_tiny|llama_tiny||cpu,graph,bf16,store,layout|0"
  "gpt2_tiny_vocab257|gpt2_tiny|-D vocab=257|cpu,bf16,store|0"
  "moe_tiny|moe_tiny||cpu,graph,store,batch|1"
  "moe_tiny_zloss|moe_tiny|-D z_loss=1e-3 -D shared_ffn=64|cpu|0"
  "gpt2_tiny_tp2|gpt2_tiny|--tp 2|cpu,device,store,launch,layout|0"
  "llama_tiny_tp2_pp2|llama_tiny|--tp 2 --pp 2|cpu,device,launch,store,recompute,pointwise|0"
  "moe_tiny_tp2_pp2|moe_tiny|--tp 2 --pp 2 --microbatches 2|cpu,device,store|0"
  # sequence parallelism: its all-gathers move bf16 values (codegen/cuda_store.h),
  # and with --recompute norms the backward gathers the norms again; with
  # --recompute layers it runs each layer's forward (its collectives too) again
  "llama_tiny_tp2_sp|llama_tiny|--tp 2 --sp|cpu,device,store,recompute,layers|0"
  "moe_tiny_pp2_dp2_ep2|moe_tiny|--pp 2 --dp 2 --ep 2 --microbatches 2|cpu,device|0"
  "moe_tiny_dp4_ep2_zero|moe_tiny|--dp 4 --ep 2 --zero 1|cpu,device,grads|0"
  # ZeRO: the params come back by all-gathers and in-place copies, which store
  # their bf16 copy too (codegen/cuda_store.h mirror_all)
  "gpt2_tiny_dp2_zero|gpt2_tiny|--dp 2 --zero 1|cpu,device,grads,store|0"
  # dp buckets assembled in place (the weight gradients written into them, the
  # concat skipped) and each gradient a view of the sum (passes/bufplan.h)
  "gpt2_tiny_dp2_buckets|gpt2_tiny|--dp 2 --bucket-mb 0.02|cpu,device,grads,store|0"
  "gpt2_tiny_pp2_dp2_zero|gpt2_tiny|--pp 2 --dp 2 --zero 1|cpu,device,grads,store|0"
  # the other schedules' stage programs with bf16 stores: interleaved chunks (two a
  # stage; the optimizer's launches batched: batch) and zero-bubble's split
  # weight-gradient (W) actions, whose bias sums run in their weight gradients'
  # GEMMs (bgrad)
  "gpt2_tiny_pp2_interleaved|gpt2_tiny|--pp 2 --schedule interleaved --virtual-stages 2 --microbatches 4|cpu,store,batch|0"
  "gpt2_tiny_pp2_zb|gpt2_tiny|--pp 2 --schedule zb --microbatches 4|cpu,store,bgrad|0")
foreach(c ${emu_cases})
  string(REPLACE "|" ";" f "${c}")
  list(GET f 0 name)
  list(GET f 1 model)
  list(GET f 2 args)
  list(GET f 3 checks)
  list(GET f 4 notices)
  add_test(NAME cuda/emu_trainer/${name}
           COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/trainer_emu.py
                   --name ${name} --model ${model} "--parc-args=${args}" --checks ${checks}
                   --graph-notices ${notices} --parc $<TARGET_FILE:parc>
                   --root ${CMAKE_SOURCE_DIR} --emu-lib $<TARGET_FILE:parcrt_cuda_emu>
                   "--link=${emu_link}" --cc ${CMAKE_C_COMPILER} --cxx ${CMAKE_CXX_COMPILER}
                   --work ${CMAKE_CURRENT_BINARY_DIR}/emu_trainer)
  set_tests_properties(cuda/emu_trainer/${name} PROPERTIES TIMEOUT 900 LABELS emu)
endforeach()
