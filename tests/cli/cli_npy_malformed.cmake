# Malformed, truncated, lying or wrong-dtype input files: exit code 1 and a message naming the
# file and the problem; never a crash.
include(${HELPERS})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k.npy fp32 1 2 64 32 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random v.npy fp32 1 2 64 32 1${SEED})
set(expect_badmagic "not a .npy file")
set(expect_truncated "needs [0-9]+ bytes")
set(expect_shapelie "shape \\[2, 4, 64, 32\\].*needs")
set(expect_descr "'<i4' is not supported")
set(expect_fortran "fortran_order")
foreach(kind badmagic truncated shapelie descr fortran)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q_${kind}.npy fp32 1 4 64 32 2${SEED})
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} corrupt q_${kind}.npy ${kind})
  step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q_${kind}.npy --k k.npy --v v.npy --check
       STDERR "q_${kind}.npy" "${expect_${kind}}")
endforeach()
# Shapes that do not fit together.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q3.npy fp32 1 3 64 32 ${SEED})
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q3.npy --k k.npy --v v.npy STDERR "3 heads.*2")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random qd.npy fp32 1 4 64 16 ${SEED})
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q qd.npy --k k.npy --v v.npy STDERR "head dim")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random v2.npy fp32 1 2 65 32 ${SEED})
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q3.npy --k k.npy --v v2.npy STDERR "v2.npy has shape")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q missing.npy --k k.npy --v v.npy STDERR "cannot open 'missing.npy'")
# Inputs that are not regular files are refused before they are opened (opening a FIFO for
# reading blocks until a writer appears): the message names the flag, the path and what it is.
step(EXPECT_RC 0 COMMAND mkfifo qfifo)
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q qfifo --k k.npy --v v.npy --timeout 3
     STDERR "--q 'qfifo' is not a regular file \\(a FIFO\\)")
file(MAKE_DIRECTORY ${WORK_DIR}/qdir)
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q qdir --k k.npy --v v.npy STDERR "--q 'qdir' is not a regular file \\(a directory\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q k.npy --k /dev/null --v v.npy
     STDERR "--k '/dev/null' is not a regular file \\(a character device\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --dry-run --q k.npy --k k.npy --v qfifo STDERR "--v 'qfifo' is not a regular file \\(a FIFO\\)")
