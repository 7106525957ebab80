# shaders.cmake — compiles src/gpu/shaders/*.comp into SPIR-V with glslc at
# build time and embeds it in the library (ekv_vk_shaders.c, generated):
# no shader compiler is needed at run time. The list is in the order of
# enum ekv_vk_pipe (src/gpu/vk.h): NAME|SOURCE|DEFINE[,DEFINE...].
set(EKV_VK_PIPES
  "rmsnorm|rmsnorm.comp|"
  "matvec_f32|matvec.comp|TYPE_F32"
  "matvec_f16|matvec.comp|TYPE_F16"
  "matvec_bf16|matvec.comp|TYPE_BF16"
  "matvec_q8_0|matvec.comp|TYPE_Q8_0"
  "matvec_q4_0|matvec.comp|TYPE_Q4_0"
  "matvec_q4_K|matvec.comp|TYPE_Q4_K"
  "matvec_q5_K|matvec.comp|TYPE_Q5_K"
  "matvec_q6_K|matvec.comp|TYPE_Q6_K"
  "matvec_f32_s16|matvec.comp|TYPE_F32,M=2"
  "matvec_f16_s16|matvec.comp|TYPE_F16,M=2"
  "matvec_bf16_s16|matvec.comp|TYPE_BF16,M=2"
  "matvec_q8_0_s16|matvec.comp|TYPE_Q8_0,M=2"
  "matvec_q4_0_s16|matvec.comp|TYPE_Q4_0,M=2"
  "matvec_q4_K_s16|matvec.comp|TYPE_Q4_K,M=2"
  "matvec_q5_K_s16|matvec.comp|TYPE_Q5_K,M=2"
  "matvec_q6_K_s16|matvec.comp|TYPE_Q6_K,M=2"
  "matvec_f32_s8|matvec.comp|TYPE_F32,M=4"
  "matvec_f16_s8|matvec.comp|TYPE_F16,M=4"
  "matvec_bf16_s8|matvec.comp|TYPE_BF16,M=4"
  "matvec_q8_0_s8|matvec.comp|TYPE_Q8_0,M=4"
  "matvec_q4_0_s8|matvec.comp|TYPE_Q4_0,M=4"
  "matvec_q4_K_s8|matvec.comp|TYPE_Q4_K,M=4"
  "matvec_q5_K_s8|matvec.comp|TYPE_Q5_K,M=4"
  "matvec_q6_K_s8|matvec.comp|TYPE_Q6_K,M=4"
  "matmul_f32|matvec.comp|TYPE_F32,PROMPT"
  "matmul_f16|matvec.comp|TYPE_F16,PROMPT"
  "matmul_bf16|matvec.comp|TYPE_BF16,PROMPT"
  "matmul_q8_0|matvec.comp|TYPE_Q8_0,PROMPT"
  "matmul_q4_0|matvec.comp|TYPE_Q4_0,PROMPT"
  "matmul_q4_K|matvec.comp|TYPE_Q4_K,PROMPT"
  "matmul_q5_K|matvec.comp|TYPE_Q5_K,PROMPT"
  "matmul_q6_K|matvec.comp|TYPE_Q6_K,PROMPT"
  "matmul_f32_s16|matvec.comp|TYPE_F32,PROMPT,M=2"
  "matmul_f16_s16|matvec.comp|TYPE_F16,PROMPT,M=2"
  "matmul_bf16_s16|matvec.comp|TYPE_BF16,PROMPT,M=2"
  "matmul_q8_0_s16|matvec.comp|TYPE_Q8_0,PROMPT,M=2"
  "matmul_q4_0_s16|matvec.comp|TYPE_Q4_0,PROMPT,M=2"
  "matmul_q4_K_s16|matvec.comp|TYPE_Q4_K,PROMPT,M=2"
  "matmul_q5_K_s16|matvec.comp|TYPE_Q5_K,PROMPT,M=2"
  "matmul_q6_K_s16|matvec.comp|TYPE_Q6_K,PROMPT,M=2"
  "matmul_f32_s8|matvec.comp|TYPE_F32,PROMPT,M=4"
  "matmul_f16_s8|matvec.comp|TYPE_F16,PROMPT,M=4"
  "matmul_bf16_s8|matvec.comp|TYPE_BF16,PROMPT,M=4"
  "matmul_q8_0_s8|matvec.comp|TYPE_Q8_0,PROMPT,M=4"
  "matmul_q4_0_s8|matvec.comp|TYPE_Q4_0,PROMPT,M=4"
  "matmul_q4_K_s8|matvec.comp|TYPE_Q4_K,PROMPT,M=4"
  "matmul_q5_K_s8|matvec.comp|TYPE_Q5_K,PROMPT,M=4"
  "matmul_q6_K_s8|matvec.comp|TYPE_Q6_K,PROMPT,M=4"
  "matvec1_f32|matvec.comp|TYPE_F32,ONE"
  "matvec1_f16|matvec.comp|TYPE_F16,ONE"
  "matvec1_bf16|matvec.comp|TYPE_BF16,ONE"
  "matvec1_q8_0|matvec.comp|TYPE_Q8_0,ONE"
  "matvec1_q4_0|matvec.comp|TYPE_Q4_0,ONE"
  "matvec1_q4_K|matvec.comp|TYPE_Q4_K,ONE"
  "matvec1_q5_K|matvec.comp|TYPE_Q5_K,ONE"
  "matvec1_q6_K|matvec.comp|TYPE_Q6_K,ONE"
  "matvec1_f32_s16|matvec.comp|TYPE_F32,ONE,M=2"
  "matvec1_f16_s16|matvec.comp|TYPE_F16,ONE,M=2"
  "matvec1_bf16_s16|matvec.comp|TYPE_BF16,ONE,M=2"
  "matvec1_q8_0_s16|matvec.comp|TYPE_Q8_0,ONE,M=2"
  "matvec1_q4_0_s16|matvec.comp|TYPE_Q4_0,ONE,M=2"
  "matvec1_q4_K_s16|matvec.comp|TYPE_Q4_K,ONE,M=2"
  "matvec1_q5_K_s16|matvec.comp|TYPE_Q5_K,ONE,M=2"
  "matvec1_q6_K_s16|matvec.comp|TYPE_Q6_K,ONE,M=2"
  "matvec1_f32_s8|matvec.comp|TYPE_F32,ONE,M=4"
  "matvec1_f16_s8|matvec.comp|TYPE_F16,ONE,M=4"
  "matvec1_bf16_s8|matvec.comp|TYPE_BF16,ONE,M=4"
  "matvec1_q8_0_s8|matvec.comp|TYPE_Q8_0,ONE,M=4"
  "matvec1_q4_0_s8|matvec.comp|TYPE_Q4_0,ONE,M=4"
  "matvec1_q4_K_s8|matvec.comp|TYPE_Q4_K,ONE,M=4"
  "matvec1_q5_K_s8|matvec.comp|TYPE_Q5_K,ONE,M=4"
  "matvec1_q6_K_s8|matvec.comp|TYPE_Q6_K,ONE,M=4")
# the KV cache's storage types, in the order of enum ekv_kv_type (from f32)
set(EKV_VK_KV_TYPES f32 f16 q8_0 q4_0 kivi2 kivi4)
set(EKV_VK_KV_DEFS KV_F32 KV_F16 KV_Q8_0 KV_Q4_0 KV_KIVI2 KV_KIVI4)
# every (key type, value type) pair of the first N types: NAME_<k>_<v> from SRC with -DKEYDEF=, -DVALDEF=
function(ekv_vk_kv_pairs name src n keydef valdef)
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    foreach(j RANGE ${last})
      list(GET EKV_VK_KV_TYPES ${i} kn)
      list(GET EKV_VK_KV_DEFS ${i} kd)
      list(GET EKV_VK_KV_TYPES ${j} vn)
      list(GET EKV_VK_KV_DEFS ${j} vd)
      list(APPEND EKV_VK_PIPES "${name}_${kn}_${vn}|${src}|${keydef}=${kd},${valdef}=${vd}")
    endforeach()
  endforeach()
  set(EKV_VK_PIPES ${EKV_VK_PIPES} PARENT_SCOPE)
endfunction()
ekv_vk_kv_pairs(rope_store rope_store.comp 4 SK SV) # the row types (KIVI rows go to the scratch as f16)
ekv_vk_kv_pairs(attn attn.comp 6 KT VT)
list(APPEND EKV_VK_PIPES
  "kivi_keys2|kivi.comp|KEYS,BITS=2"
  "kivi_keys4|kivi.comp|KEYS,BITS=4"
  "kivi_values2|kivi.comp|VALUES,BITS=2"
  "kivi_values4|kivi.comp|VALUES,BITS=4"
  "kivi_copy|kivi.comp|COPY"
  "attn_combine|attn_combine.comp|"
  "glu|glu.comp|"
  "attn_stats_f32|attn_stats.comp|KT=KV_F32"
  "attn_stats_f16|attn_stats.comp|KT=KV_F16"
  "attn_stats_q8_0|attn_stats.comp|KT=KV_Q8_0"
  "attn_stats_q4_0|attn_stats.comp|KT=KV_Q4_0"
  "attn_stats_kivi2|attn_stats.comp|KT=KV_KIVI2"
  "attn_stats_kivi4|attn_stats.comp|KT=KV_KIVI4"
  "kv_compact|kv_compact.comp|"
  "kv_merge_f32|kv_merge.comp|ST=KV_F32"
  "kv_merge_f16|kv_merge.comp|ST=KV_F16"
  "kv_merge_q8_0|kv_merge.comp|ST=KV_Q8_0"
  "kv_merge_q4_0|kv_merge.comp|ST=KV_Q4_0"
  "layernorm|layernorm.comp|"
  "clip_attn|clip_attn.comp|"
  "ew|ew.comp|"
  "kivi_pack_keys2|kivi_pack.comp|KEYS,BITS=2"
  "kivi_pack_keys4|kivi_pack.comp|KEYS,BITS=4"
  "kivi_pack_values2|kivi_pack.comp|VALUES,BITS=2"
  "kivi_pack_values4|kivi_pack.comp|VALUES,BITS=4"
  "kv_merge_kivi2_k|kv_merge.comp|ST=KV_KIVI2"
  "kv_merge_kivi4_k|kv_merge.comp|ST=KV_KIVI4"
  "kv_merge_kivi2_v|kv_merge.comp|ST=KV_KIVI2,IS_V=true"
  "kv_merge_kivi4_v|kv_merge.comp|ST=KV_KIVI4,IS_V=true")

# Extra defines for every shader, for measuring a variant side by side
# (e.g. -DEKV_VK_SHADER_DEFS=NAME in a second build directory, with an
# #ifdef NAME in the shader; bench/gpu/ab.sh compares the builds).
set(EKV_VK_SHADER_DEFS "" CACHE STRING "extra -D defines for every GPU shader (experiments)")
set(EKV_VK_SHADER_DIR ${PROJECT_SOURCE_DIR}/src/gpu/shaders)
set(EKV_VK_GEN_DIR ${PROJECT_BINARY_DIR}/gpu)
file(MAKE_DIRECTORY ${EKV_VK_GEN_DIR})
file(GLOB EKV_VK_SHADER_DEPS ${EKV_VK_SHADER_DIR}/*.comp ${EKV_VK_SHADER_DIR}/*.glsl)
set(EKV_VK_INCS "")
set(EKV_VK_TABLE "")
set(EKV_VK_ARRAYS "")
foreach(entry ${EKV_VK_PIPES})
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 name)
  list(GET parts 1 src)
  list(LENGTH parts np)
  set(defs "")
  if(np GREATER 2)
    list(GET parts 2 def)
    if(def)
      string(REPLACE "," ";" deflist "${def}")
      foreach(d ${deflist})
        list(APPEND defs "-D${d}")
      endforeach()
    endif()
  endif()
  foreach(d ${EKV_VK_SHADER_DEFS})
    list(APPEND defs "-D${d}")
  endforeach()
  set(out ${EKV_VK_GEN_DIR}/${name}.spv.inc)
  add_custom_command(OUTPUT ${out}
    COMMAND ${EKV_GLSLC} --target-env=vulkan1.2 -O -mfmt=c ${defs} -I ${EKV_VK_SHADER_DIR}
            -o ${out} ${EKV_VK_SHADER_DIR}/${src}
    DEPENDS ${EKV_VK_SHADER_DEPS}
    COMMENT "glslc ${src} ${defs}")
  list(APPEND EKV_VK_INCS ${out})
  string(APPEND EKV_VK_ARRAYS "static const uint32_t ekv_spv_${name}[] =\n#include \"${name}.spv.inc\"\n;\n")
  string(APPEND EKV_VK_TABLE "    {\"${name}\", ekv_spv_${name}, sizeof ekv_spv_${name}},\n")
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/src/gpu/shaders.c.in ${EKV_VK_GEN_DIR}/ekv_vk_shaders.c @ONLY)
add_custom_target(ekv_vk_spirv DEPENDS ${EKV_VK_INCS})
