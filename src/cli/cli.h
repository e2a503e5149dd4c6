/* cli.h — subcommands of the `clef` program.  Each takes argc/argv with
 * argv[0] = the subcommand name and returns the process exit status
 * (0 ok, 1 runtime failure, 2 bad usage or a rejected request). */
#ifndef CLEF_CLI_CLI_H
#define CLEF_CLI_CLI_H

int cli_decide(int argc, char **argv);
int cli_demo(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_quantize(int argc, char **argv);
int cli_parity(int argc, char **argv);

#endif
