from specrt.cli.main import main

main(prog_name="specrt")
