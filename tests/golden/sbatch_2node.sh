#!/bin/bash

# Parameters
#SBATCH --account=proj
#SBATCH --constraint='h100&ib'
#SBATCH --cpus-per-task=8
#SBATCH --error=<TMP>/runs/llm/RUNID/submitit/%j_0_log.err
#SBATCH --gpus-per-node=4
#SBATCH --gres-flags=enforce-binding
#SBATCH --job-name=llm
#SBATCH --mem=65536M
#SBATCH --no-kill
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=<TMP>/runs/llm/RUNID/submitit/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --requeue
#SBATCH --reservation=big
#SBATCH --signal=USR2@180
#SBATCH --time=120

# setup
module load cuda/12.4
# clusterfsdp run RUNID: the control plane's job steps around srun (clusterfsdp.control.jobstep)
PY=<PYTHON>
RUN=<TMP>/runs/llm/RUNID
"$PY" -m clusterfsdp.control.jobstep before "$RUN" || exit $?

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <TMP>/runs/llm/RUNID/submitit/%j_%t_log.out --error <TMP>/runs/llm/RUNID/submitit/%j_%t_log.err --kill-on-bad-exit=1 <PYTHON> -u -m submitit.core._submit <TMP>/runs/llm/RUNID/submitit


# teardown
exec "$PY" -m clusterfsdp.control.jobstep after "$RUN" "$?"