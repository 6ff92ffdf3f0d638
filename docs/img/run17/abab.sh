#!/bin/bash
# Before (0bf7b89, a worktree at /tmp/before on PYTHONPATH) against after (HEAD), alternated B A B A, each the
# defaults section at 2 and 4 lanes for the model drafters, pinned to core 1. usage: bash abab.sh OUTDIR
out=${1:-.}
args="--sections defaults --lanes 2 4 --backends dflash2 mtp --prompts 2 --max-tokens 48 --repeats 8"
for i in 1 2; do
  (cd /tmp/before && PYTHONPATH=/tmp/before taskset -c 1 python -m speclane.bench $args > $out/ab-before-$i.txt 2>&1)
  (cd /work/main && taskset -c 1 python -m speclane.bench $args > $out/ab-after-$i.txt 2>&1)
done
