/* plot.h: loss curves as SVG, drawn from apex-train's JSON-lines logs without any dependency: the
 * training loss and the evaluation loss against the step on the left axis, the loss scale on a
 * second (log2) axis on the right, and a mark at every skipped step; one colour per log, so that
 * several runs (opt levels, say) can be compared on one plot.
 *
 * The SVG is meant to be read back too: the plot area is a <rect class="plot-area"> whose data-*
 * attributes give the axes' ranges (data-x-min, data-x-max, data-y-min, data-y-max for the loss,
 * data-s-min, data-s-max for log2 of the loss scale), each log's curves are <polyline> elements of
 * class train-loss, eval-loss and loss-scale with a data-log attribute, and each skipped step is a
 * <path class="skipped" data-step="N">. */
#ifndef APEX_TRAIN_PLOT_H
#define APEX_TRAIN_PLOT_H

#include <stddef.h>

/* Draws the logs into svg_path (written through a temporary and renamed, so a failure leaves no
 * file). Prints one line naming the file and line and returns non-zero for an unreadable log, a
 * line that is not a JSON object, or a log without any training step. */
int plot_logs(const char *const *logs, int n, const char *svg_path);
/* The SVG path drawn next to a log: its name with .jsonl, .json or .log replaced by .svg (or .svg
 * appended). Non-zero when it does not fit in size. */
int plot_path_for(const char *log, char *out, size_t size);
/* `apex-train plot [-o OUT.svg] LOG...`: argv[0] is "plot". Returns the exit code. */
int plot_main(int argc, char **argv);

#endif
