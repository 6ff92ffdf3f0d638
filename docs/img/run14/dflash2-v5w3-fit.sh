#!/bin/bash
# Fourteenth session, issue 18, third round: the file shipped at 586f2cf fitted 3,000 steps more on the 960 answers
# plus every train function's code-generation ask (--write-prompts 2133: all there are; the first 1,440 the same asks
# as before), decay 2, lr 3e-4 cosine; one thread on core 1, bf16 autocast.
set -e
cd /work/main && . .venv/bin/activate
STDLIB=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
CORPUS="$STDLIB /usr/share/common-licenses py:pydoc_data.topics.topics"
OMP_NUM_THREADS=1 taskset -c 1 speclane fit-drafter --backend dflash2 --version 5 --corpus $CORPUS --work /work/fit-dflash14/v5w3 \
  --seed 0 --prompts 960 --write-prompts 2133 --heldout-prompts 32 --forced 0 --out /work/fit-dflash14/v5w3/out --steps 3000 --lr 3e-4 \
  --anchors 48 --decay 2 --init /work/main/stages/models/assets --checkpoint-every 1000 --threads 1
