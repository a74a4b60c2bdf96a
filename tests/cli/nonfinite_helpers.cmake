# Shared by cli_nonfinite and cli_mpi_nonfinite (included after helpers.cmake).
# nonfinite_inputs(S): q, k, v, do [1, 2|1, S, 16] and copies with one element planted:
# k10 (k[10, dim 0] = NaN), k0, k30, k90, v10 (v[10, dim 0] = NaN), v50, k20inf and v20inf (+Inf at 20).
function(nonfinite_inputs s)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q.npy fp32 1 2 ${s} 16 ${SEED})
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k.npy fp32 1 1 ${s} 16 ${SEED}1)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random v.npy fp32 1 1 ${s} 16 ${SEED}2)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random do.npy fp32 1 2 ${s} 16 ${SEED}3)
  foreach(plant k:10:nan k:0:nan k:30:nan k:90:nan v:10:nan v:50:nan k:20:inf v:20:inf)
    string(REPLACE ":" ";" p ${plant})
    list(GET p 0 x)
    list(GET p 1 tok)
    list(GET p 2 kind)
    set(name ${x}${tok})
    if(kind STREQUAL "inf")
      set(name ${name}inf)
    endif()
    math(EXPR index "${tok} * 16")
    file(COPY_FILE ${WORK_DIR}/${x}.npy ${WORK_DIR}/${name}.npy)
    step(EXPECT_RC 0 COMMAND ${NPY_TOOL} poison ${name}.npy ${index} ${kind})
  endforeach()
endfunction()

# expect_nonfinite(FILE TOKENS): FILE's tokens holding a NaN or Inf are exactly TOKENS ("10-14",
# "0,3-5", "none").
function(expect_nonfinite file tokens)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} nonfinite ${file} STDOUT "^nonfinite tokens: ${tokens}\n$")
endfunction()
