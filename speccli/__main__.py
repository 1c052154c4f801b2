from speccli.cli import main

main()
