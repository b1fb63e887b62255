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
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=<TMP>/runs/llm/RUNID/submitit/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --requeue
#SBATCH --reservation=big
#SBATCH --signal=USR2@180
#SBATCH --time=120
#SBATCH --wckey=submitit

# setup
module load cuda/12.4

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <TMP>/runs/llm/RUNID/submitit/%j_%t_log.out --error <TMP>/runs/llm/RUNID/submitit/%j_%t_log.err <PYTHON> -u -m clusterfsdp.worker <TMP>/runs/llm/RUNID
