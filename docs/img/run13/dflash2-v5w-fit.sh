#!/bin/bash
# Thirteenth session, issue 18: the shipped dflash2 (version 5) fitted further on its 960 generated answers plus 480
# answers to the bench's code-generation ask ("Write a Python function `def ...`" + docstring, train documents only,
# --write-prompts), decay 2, lr 3e-4 cosine, 3000 steps; one thread on core 1, bf16 autocast.
set -e
cd /work/main && . .venv/bin/activate
STDLIB=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
CORPUS="$STDLIB /usr/share/common-licenses py:pydoc_data.topics.topics"
OMP_NUM_THREADS=1 taskset -c 1 speclane fit-drafter --backend dflash2 --version 5 --corpus $CORPUS --work /work/fit-dflash13/v5w \
  --seed 0 --prompts 960 --write-prompts 480 --heldout-prompts 32 --forced 0 --out /work/fit-dflash13/v5w/out --steps 3000 --lr 3e-4 \
  --anchors 48 --decay 2 --init /work/main/stages/models/assets --checkpoint-every 500 --threads 1
