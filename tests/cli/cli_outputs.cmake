# Output files (--out, --lse, --json): checked before any compute and by --dry-run, written whole
# or not at all, never aliasing each other or an input.
include(${HELPERS})
# A missing directory stops the run before it computes (no table on stdout), and the dry run.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --out nodir/x.npy
     STDERR "--out nodir/x.npy: cannot write the output there: its directory 'nodir' does not exist")
execute_process(COMMAND ${RINGATTN} run --seq 64 --out nodir/x.npy OUTPUT_VARIABLE out ERROR_QUIET
                WORKING_DIRECTORY ${WORK_DIR})
if(out MATCHES "time ")
  message(FATAL_ERROR "a run with an unwritable --out computed before failing:\n${out}")
endif()
foreach(flag --out --lse --json)
  step(EXPECT_RC 1 COMMAND ${RINGATTN} run --dry-run --seq 64 ${flag} nodir/x
       STDERR "${flag} nodir/x: cannot write the output there: its directory 'nodir' does not exist")
endforeach()
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --dry-run --seq 64 --out o.npy --json r.json
     STDOUT "outputs  ok: every output file can be created" "dry run: OK")
# A bad --lse leaves no header-only --out behind.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --out o1.npy --lse nodir/l.npy STDERR "--lse nodir/l.npy")
if(EXISTS ${WORK_DIR}/o1.npy)
  message(FATAL_ERROR "o1.npy was left behind by a run whose --lse could not be written")
endif()
# A device is not an output file (a rename would replace it); a failed --json write exits 1.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --json /dev/full
     STDERR "--json /dev/full: cannot write the output there: it exists and is not a regular file")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 -n 1 --json /dev/full
     STDERR "--json /dev/full: cannot write the output there")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --out . STDERR "--out .: cannot write the output there: it is a directory")
# An output that is a symbolic link is written through it: the link stays (the rename used to
# replace the link itself with a regular file); /dev/stdout, here a pipe, is refused like a device.
file(MAKE_DIRECTORY ${WORK_DIR}/real)
file(WRITE ${WORK_DIR}/real/target.json "old")
file(CREATE_LINK real/target.json ${WORK_DIR}/link.json SYMBOLIC)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --seq 128 --heads 2 --kv-heads 1 --dim 16 --json link.json)
file(READ ${WORK_DIR}/real/target.json written)
if(NOT IS_SYMLINK ${WORK_DIR}/link.json OR NOT written MATCHES "^{")
  message(FATAL_ERROR "--json link.json did not write through the link: link kept? target holds: ${written}")
endif()
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 128 --heads 2 --kv-heads 1 --dim 16 --json /dev/stdout
     STDERR "--json /dev/stdout: cannot write the output there: it exists and is not a regular file")
# Outputs that alias each other or an input are refused, and the input survives.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --out same.npy --lse same.npy
     STDERR "--out same.npy and --lse same.npy name the same file")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --out same.npy --lse ./same.npy
     STDERR "--out same.npy and --lse ./same.npy name the same file")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q.npy fp32 1 2 64 16 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k.npy fp32 1 1 64 16 1${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random v.npy fp32 1 1 64 16 2${SEED})
file(SHA256 ${WORK_DIR}/q.npy before)
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --out q.npy
     STDERR "--out q.npy is the input file of --q q.npy: writing it would overwrite the input")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --lse ./v.npy
     STDERR "--lse ./v.npy is the input file of --v v.npy")
file(SHA256 ${WORK_DIR}/q.npy after)
if(NOT before STREQUAL after)
  message(FATAL_ERROR "the input q.npy changed")
endif()
# A good run replaces an existing output whole and leaves no temporary file.
file(WRITE ${WORK_DIR}/o.npy "old")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --causal --out o.npy --lse l.npy --json r.json)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} reference q.npy k.npy v.npy o.npy l.npy causal 1e-4)
file(GLOB partial ${WORK_DIR}/*partial*)
if(partial)
  message(FATAL_ERROR "temporary files left behind: ${partial}")
endif()
