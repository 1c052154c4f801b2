from speccli.cli.app import main

main()
