/* hf_init.h: --init-from a Hugging Face GPT-2 (GPT2LMHeadModel's model.safetensors, apex/gpt_hf.h):
 * the model's sizes come from the file, and the file is loaded in its own layout. */
#ifndef APEX_TRAIN_HF_INIT_H
#define APEX_TRAIN_HF_INIT_H

#include "args.h"
#include "dataset.h"
#include "models.h"

/* 1 when path is a safetensors file in Hugging Face's GPT-2 layout (transformer.wte.weight), else 0
 * (also for an unreadable file: the load reports that). */
int hf_is_file(const char *path);

/* For --init-from a->init_from: when it is a Hugging Face GPT-2 (*is_hf = 1), dims gets the file's
 * vocab, n_layer and n_embd, and n_head from --n-head (or n_embd / 64, GPT-2's head width, when
 * n_embd is a multiple of 64); each flag given must agree with the file, --seq-len must fit its
 * position table and the data's tokens its vocabulary (d->vocab becomes the file's). A GPT file that is
 * in neither apex-train's layout nor Hugging Face's, or a Hugging Face file for another --model, is
 * refused. 0, or an exit status after one line on stderr. */
int hf_init_dims(const train_args *a, model_kind kind, const char *data, dataset *d, model_dims *dims, int *is_hf);

/* Loads the file into the model built from those dims (amp's masters too). 0, or 1 after one line. */
int hf_init_load(const train_args *a, train_model *tm, apex_amp *amp);

#endif
